// Bridges to other formats: exporting a committed step as Hugging Face
// safetensors (what transformers' from_pretrained and the Hub take), and
// importing safetensors checkpoints as hoist steps. (Orbax and PyTorch DCP
// checkpoints are imported from Python, through their own libraries.)
//
// A safetensors file is an 8-byte little-endian header length, a JSON
// header {name: {"dtype", "shape", "data_offsets": [begin, end]}, with
// "__metadata__": {str: str}}, then every tensor's bytes in C order, back
// to back. A model larger than one file is split into
// model-00001-of-0000N.safetensors files plus model.safetensors.index.json
// ({"metadata": {"total_size"}, "weight_map": {name: file}}), the Hub's
// convention; a smaller one is model.safetensors.
//
// The export streams: it reads the step's extents into at most
// `memory_bytes` of host memory at a time, in pieces of whole arrays or of
// runs of rows, writing earlier pieces while it reads the next, whatever
// the model's size. Each extent is read once and in order however the
// pieces cut it, its hash checked at its last byte. Each file is written under
// a temporary name, fsynced, and renamed into place, the index last, so an
// interrupted export leaves no file that looks complete.
#ifndef HOIST_INTEROP_H_
#define HOIST_INTEROP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hoist/checkpoint_types.h"
#include "hoist/storage.h"

namespace hoist {

struct SafetensorsExportOptions {
  // A file holds at most this many bytes of tensors before the next begins
  // (default 5 GB, the Hub's); a tensor larger than that gets a file alone.
  int64_t max_shard_bytes = 5'000'000'000;
  // "FROM" or "FROM=TO": export only the arrays whose names start with
  // FROM, with FROM replaced by TO (default "": every array, as named).
  // "model/" exports what {"model": state_dict} saved under its state
  // dict's own names.
  std::string prefix;
  // Host memory for bytes in flight (default 256 MiB; at least 1 MiB): a
  // sixteenth (at most 16 MiB) for each of 4 reader threads, the rest for
  // 4 chunks read, hashed or being written.
  int64_t memory_bytes = int64_t{256} << 20;
  // How the step is read and `out_dir` written (an object store's
  // endpoint, ...; default: the environment's).
  StorageOptions storage = {};
  // Counts the bytes read (twice over where the step is read twice) and
  // names the file under way, when set. Default none.
  OperationProgress* progress = nullptr;
};

struct ExportStats {
  int64_t tensors = 0;
  int64_t bytes = 0;               // tensor bytes written
  int64_t bytes_read = 0;          // from the checkpoint (== bytes;
                                   // 2 x bytes into an object store)
  std::vector<std::string> files;  // written, in order (the index last)
  absl::Duration elapsed;
};

// Exports the committed step at `step_dir` (ROOT/step_N, or a root: its
// newest step) into the directory `out_dir` (created if missing; it must
// not already hold model.safetensors or an index). `out_dir` may be an
// s3:// or gs:// prefix (configured by the environment, as a root is): each
// file is then one object under its own name, complete or absent, and the
// step is read twice (the hashes in a file's header precede its bytes). Every
// tensor's XXH3-64 of its exported bytes goes into its file's "__metadata__"
// under "hoist.xxh3" (a JSON object name -> 16 hex digits), with "format": "pt"
// (transformers requires it) and "hoist.step". Errors: kNotFound without a
// committed step; kAlreadyExists when out_dir holds an export;
// kInvalidArgument for bad options, a prefix no array has, or a name
// safetensors cannot hold (empty, "__metadata__"); kDataLoss for corrupt
// extents; storage errors as is.
absl::StatusOr<ExportStats> ExportSafetensors(
    const std::string& step_dir, const std::string& out_dir,
    const SafetensorsExportOptions& options = {});

// One tensor of a safetensors source, checked.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // hoist's name ("bfloat16")
  std::vector<int64_t> shape;
  std::string file;
  int64_t offset = 0;  // of its first byte in `file`
  int64_t bytes = 0;
};

// The tensors of the safetensors source `src`: a file, or a directory
// holding model.safetensors.index.json and the shards it names, or one
// *.safetensors file. Every header is checked whole before any tensor is
// read: kDataLoss naming the file, the tensor and the fault (a header that
// runs past the file, is not JSON or not an object; an entry without
// exactly dtype, shape and data_offsets; a dtype hoist lacks; offsets
// outside the data or not the shape's size; tensors that overlap or leave a
// gap; a tensor in two files; an index whose shard names are not plain file
// names); kNotFound for a missing source or a shard the index names but the
// directory lacks.
absl::StatusOr<std::vector<SafetensorsTensor>> ReadSafetensorsHeaders(
    const std::string& src, const StorageOptions& storage = {});

struct ImportStats {
  int64_t step = 0;
  std::string path;  // the committed step's directory
  int64_t arrays = 0;
  int64_t bytes = 0;
  absl::Duration elapsed;
};

// Saves the safetensors source `src` as step `step` of the hoist root
// `root` (created if needed) through a CheckpointManager of its own (the
// root's lock, one host device, a staging pool of `pool_bytes`, or of the
// largest tensor's size if that is larger: a tensor is staged whole): the
// files are memory-mapped and their tensors staged through the pool, so
// host memory stays bounded by the pool whatever the checkpoint's size. Array
// names are the tensor names; the manifest's metadata is {"imported_from":
// {"format": "safetensors", "path": src}}. Nothing is written unless
// ReadSafetensorsHeaders accepts the source. `storage` opens `root` (and
// `src`, which must be local). Errors: those of
// ReadSafetensorsHeaders; kAlreadyExists for a committed step;
// kFailedPrecondition when another manager holds the root; storage errors.
// ImportSafetensors' staging pool unless the caller gives one.
inline constexpr int64_t kImportPoolBytes = int64_t{256} << 20;

// `progress` (optional) counts the bytes written of the tensors'.
absl::StatusOr<ImportStats> ImportSafetensors(
    const std::string& src, const std::string& root, int64_t step,
    int64_t pool_bytes = kImportPoolBytes, const StorageOptions& storage = {},
    OperationProgress* progress = nullptr);

// The safetensors name of a hoist dtype name ("bfloat16" -> "BF16",
// "float8_e4m3fn" -> "F8_E4M3"), and back; kInvalidArgument for a name the
// other side lacks.
absl::StatusOr<std::string> SafetensorsDType(const std::string& hoist_dtype);
absl::StatusOr<std::string> HoistDTypeOfSafetensors(
    const std::string& safetensors_dtype);

}  // namespace hoist

#endif  // HOIST_INTEROP_H_
