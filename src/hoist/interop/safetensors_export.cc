// Export of a committed step to safetensors. The protocol, per export:
//
//   1. Read and check the step's manifest; select and rename the arrays
//      (the prefix option); refuse two arrays that map to one name, and an
//      out_dir that already holds an export.
//   2. Lay out the files: tensors in the manifest's order, a new file when
//      the next tensor would take the current one past max_shard_bytes.
//      Each file's header is known now up to the hashes, whose hex digits
//      have a fixed width, so its length (padded with spaces to 8 bytes) and
//      every tensor's offset are fixed before any byte moves.
//   3. Cut the tensors into pieces (a whole tensor, or a run of rows at the
//      outermost axis whose rows fit) and the pieces into chunks of at most
//      half the memory; a chunk never crosses a file. Read a chunk (through
//      CheckpointRoot::Read: only the extents it meets, each hash checked)
//      while the writer thread writes the previous one, hashing each
//      tensor's bytes in order.
//   4. Write each file's header with the hashes at offset 0, fsync, close,
//      rename the file from its temporary name into place; then the index
//      (when there is more than one file), the same way; fsync out_dir.
// On error the temporary files are removed and no final name was made.
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/layout.h"
#include "hoist/interop.h"
#include "hoist/interop/safetensors_names.h"

namespace hoist {
namespace {

constexpr int kHashHexDigits = 16;
// Writes whose offset, length and memory are multiples of this go straight
// to the disk (O_DIRECT).
constexpr int64_t kBlockBytes = 4096;
// Direct writes of one chunk in flight at once.
constexpr int64_t kWritesInFlight = 4;

struct Tensor {
  const ManifestArray* array;
  std::string name;  // in the export
  int64_t bytes = 0;
  int file = 0;
  int64_t offset = 0;  // in its file, from the start of the file
  XXH3_state_t* hash = nullptr;
};

struct OutFile {
  std::string name;
  std::vector<int> tensors;
  int64_t header_bytes = 0;  // the JSON, padded
  int64_t data_bytes = 0;
  std::unique_ptr<WritableFile> file;
  std::string tmp_path;
};

// A part of a tensor: `box` of it, whose bytes lie contiguously in the
// tensor's C-order bytes from `offset_in_tensor`.
struct Piece {
  int tensor;
  Box box;
  int64_t bytes;
};

struct Chunk {
  int file = 0;
  int64_t file_offset = 0;  // where its first byte goes
  int64_t bytes = 0;
  std::vector<Piece> pieces;
};

std::string HeaderText(const std::vector<Tensor>& tensors, const OutFile& file,
                       int64_t step, const std::vector<std::string>& hashes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json xxh3 = nlohmann::ordered_json::object();
  int64_t at = 0;
  for (int t : file.tensors) {
    const Tensor& tensor = tensors[t];
    header[tensor.name] = {
        {"dtype",
         *SafetensorsDType(std::string(DTypeName(tensor.array->dtype)))},
        {"shape", tensor.array->shape},
        {"data_offsets", {at, at + tensor.bytes}}};
    xxh3[tensor.name] = hashes[t];
    at += tensor.bytes;
  }
  nlohmann::ordered_json metadata = {{"format", "pt"},
                                     {"hoist.step", absl::StrCat(step)},
                                     {"hoist.xxh3", xxh3.dump()}};
  nlohmann::ordered_json out = {{"__metadata__", metadata}};
  out.update(header);
  // Spaces (which JSON allows) up to a 4 KiB boundary: the tensors' bytes
  // then start where direct writes can reach them.
  std::string text = out.dump();
  text.append((kBlockBytes - (8 + text.size()) % kBlockBytes) % kBlockBytes,
              ' ');
  return text;
}

// (root, step) of a step directory or of a root's newest step.
absl::StatusOr<std::pair<std::unique_ptr<CheckpointRoot>, int64_t>> OpenStep(
    const std::string& path) {
  absl::StatusOr<std::pair<std::string, int64_t>> split = SplitStepDir(path);
  if (split.ok()) {
    ASSIGN_OR_RETURN(auto root, CheckpointRoot::OpenForReading(split->first));
    return std::make_pair(std::move(root), split->second);
  }
  ASSIGN_OR_RETURN(auto root, CheckpointRoot::OpenForReading(path));
  ASSIGN_OR_RETURN(std::optional<int64_t> latest, root->Latest());
  if (!latest) {
    return absl::NotFoundError(
        absl::StrFormat("%s holds no committed step", path));
  }
  return std::make_pair(std::move(root), *latest);
}

// The tensors to export, renamed by `prefix` ("FROM" or "FROM=TO").
absl::StatusOr<std::vector<Tensor>> SelectTensors(const Manifest& manifest,
                                                  const std::string& prefix) {
  std::string from = prefix, to;
  if (size_t eq = prefix.find('='); eq != std::string::npos) {
    from = prefix.substr(0, eq);
    to = prefix.substr(eq + 1);
  }
  std::vector<Tensor> tensors;
  for (const ManifestArray& array : manifest.arrays) {
    if (!absl::StartsWith(array.name, from)) continue;
    Tensor tensor{&array, to + array.name.substr(from.size())};
    if (tensor.name.empty() || tensor.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array '%s' would be exported as '%s', which safetensors cannot "
          "hold",
          array.name, tensor.name));
    }
    tensor.bytes = ItemSize(array.dtype);
    for (int64_t n : array.shape) tensor.bytes *= n;
    tensors.push_back(std::move(tensor));
  }
  if (tensors.empty()) {
    return absl::InvalidArgumentError(
        from.empty()
            ? "the step holds no arrays"
            : absl::StrFormat("no array's name starts with '%s'", from));
  }
  return tensors;
}

std::vector<OutFile> LayOutFiles(std::vector<Tensor>& tensors,
                                 int64_t max_shard_bytes) {
  std::vector<OutFile> files(1);
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (!files.back().tensors.empty() &&
        files.back().data_bytes + tensors[t].bytes > max_shard_bytes) {
      files.emplace_back();
    }
    tensors[t].file = static_cast<int>(files.size()) - 1;
    files.back().tensors.push_back(static_cast<int>(t));
    files.back().data_bytes += tensors[t].bytes;
  }
  for (size_t f = 0; f < files.size(); ++f) {
    files[f].name = files.size() == 1
                        ? kSafetensorsSingleFile
                        : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                          f + 1, files.size());
  }
  return files;
}

// The pieces of `tensor` of at most `limit` bytes each: the whole tensor,
// or runs along the outermost axis whose units (one index there, the rest
// whole) fit in `limit`, over every index of the axes before it.
std::vector<Piece> PiecesOf(int t, const Tensor& tensor, int64_t limit) {
  const std::vector<int64_t>& shape = tensor.array->shape;
  if (tensor.bytes <= limit) {
    return {
        {t, Box(std::vector<int64_t>(shape.size(), 0), shape), tensor.bytes}};
  }
  size_t axis = 0;
  int64_t unit = tensor.bytes;
  while (axis < shape.size()) {
    unit /= shape[axis];
    if (unit <= limit) break;
    ++axis;
  }
  const int64_t run = std::max<int64_t>(1, limit / unit);
  std::vector<Piece> pieces;
  std::vector<int64_t> index(axis, 0);  // over the axes before `axis`
  while (true) {
    for (int64_t start = 0; start < shape[axis]; start += run) {
      std::vector<int64_t> origin(shape.size(), 0), extent = shape;
      for (size_t a = 0; a < axis; ++a) {
        origin[a] = index[a];
        extent[a] = 1;
      }
      origin[axis] = start;
      extent[axis] = std::min(run, shape[axis] - start);
      pieces.push_back({t, Box(origin, extent), extent[axis] * unit});
    }
    int a = static_cast<int>(axis) - 1;
    while (a >= 0 && ++index[a] == shape[a]) index[a--] = 0;
    if (a < 0) break;
  }
  return pieces;
}

std::vector<Chunk> CutChunks(const std::vector<Tensor>& tensors,
                             const std::vector<OutFile>& files,
                             int64_t chunk_bytes) {
  std::vector<Chunk> chunks;
  for (size_t f = 0; f < files.size(); ++f) {
    Chunk chunk;
    chunk.file = static_cast<int>(f);
    for (int t : files[f].tensors) {
      if (tensors[t].bytes == 0) continue;
      for (Piece& piece : PiecesOf(t, tensors[t], chunk_bytes)) {
        if (chunk.bytes + piece.bytes > chunk_bytes && chunk.bytes > 0) {
          chunks.push_back(std::move(chunk));
          chunk = Chunk();
          chunk.file = static_cast<int>(f);
        }
        if (chunk.pieces.empty()) {
          // Where the piece's bytes start in the file.
          int64_t offset = tensors[t].offset;
          const std::vector<int64_t>& shape = tensors[t].array->shape;
          int64_t stride = tensors[t].bytes;
          for (size_t a = 0; a < shape.size(); ++a) {
            stride /= shape[a];
            offset += piece.box.origin()[a] * stride;
          }
          chunk.file_offset = offset;
        }
        chunk.bytes += piece.bytes;
        chunk.pieces.push_back(std::move(piece));
      }
    }
    if (chunk.bytes > 0) chunks.push_back(std::move(chunk));
  }
  return chunks;
}

// Hashes chunk `chunk` (at `bytes`, behind `carry` bytes of the previous
// chunk's tail in the same buffer, which starts at a block boundary of the
// file) and writes every whole block of the buffer directly; the rest, less
// than a block, is the next chunk's carry, or, for the last chunk of its
// file, written through the page cache now.
absl::Status WriteChunk(const Chunk& chunk, bool last_of_file,
                        const uint8_t* buffer, int64_t carry,
                        std::vector<Tensor>& tensors, OutFile& file) {
  int64_t at = carry;
  for (const Piece& piece : chunk.pieces) {
    XXH3_64bits_update(tensors[piece.tensor].hash, buffer + at, piece.bytes);
    at += piece.bytes;
  }
  const int64_t base = chunk.file_offset - carry;
  const int64_t whole = at / kBlockBytes * kBlockBytes;
  // Several writes in flight at once, as the disk wants (one stream of
  // large writes reaches about two thirds of its limit here).
  const int64_t part =
      (whole / kWritesInFlight + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  std::vector<std::future<absl::Status>> writes;
  for (int64_t from = 0; from < whole; from += part) {
    const int64_t length = std::min(part, whole - from);
    writes.push_back(std::async(std::launch::async, [&, from, length] {
      return file.file->WriteAt(base + from,
                                absl::MakeConstSpan(buffer + from, length));
    }));
  }
  absl::Status written;
  for (auto& write : writes) written.Update(write.get());
  RETURN_IF_ERROR(written);
  if (!last_of_file || at == whole) return absl::OkStatus();
  return file.file->WriteAt(base + whole,
                            absl::MakeConstSpan(buffer + whole, at - whole));
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDType(const std::string& hoist_dtype) {
  static const auto* names = new std::map<std::string, std::string>{
      {"bool", "BOOL"},          {"int8", "I8"},
      {"int16", "I16"},          {"int32", "I32"},
      {"int64", "I64"},          {"uint8", "U8"},
      {"uint16", "U16"},         {"uint32", "U32"},
      {"uint64", "U64"},         {"float16", "F16"},
      {"bfloat16", "BF16"},      {"float32", "F32"},
      {"float64", "F64"},        {"float8_e4m3fn", "F8_E4M3"},
      {"float8_e5m2", "F8_E5M2"}};
  auto it = names->find(hoist_dtype);
  if (it == names->end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dtype %s has no safetensors name", hoist_dtype));
  }
  return it->second;
}

absl::StatusOr<std::string> HoistDTypeOfSafetensors(
    const std::string& safetensors_dtype) {
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    if (SafetensorsDType(name).value_or("") == safetensors_dtype) return name;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "safetensors dtype %s has no hoist dtype", safetensors_dtype));
}

absl::StatusOr<ExportStats> ExportSafetensors(
    const std::string& step_dir, const std::string& out_dir,
    const SafetensorsExportOptions& options) {
  const absl::Time start = absl::Now();
  if (options.max_shard_bytes <= 0 || options.memory_bytes < (1 << 20)) {
    return absl::InvalidArgumentError(
        "export options: max_shard_bytes must be positive and memory_bytes "
        "at least 1 MiB");
  }
  // 1
  ASSIGN_OR_RETURN(auto opened, OpenStep(step_dir));
  const std::unique_ptr<CheckpointRoot>& root = opened.first;
  const int64_t step = opened.second;
  ASSIGN_OR_RETURN(const Manifest manifest, root->ReadManifest(step));
  ASSIGN_OR_RETURN(std::vector<Tensor> tensors,
                   SelectTensors(manifest, options.prefix));
  std::unique_ptr<Storage> storage = MakePosixStorage();
  ASSIGN_OR_RETURN(bool out_exists, storage->Exists(out_dir));
  if (!out_exists) RETURN_IF_ERROR(storage->CreateDir(out_dir));
  for (const char* name : {kSafetensorsSingleFile, kSafetensorsIndexFile}) {
    ASSIGN_OR_RETURN(bool taken, storage->Exists(JoinPath(out_dir, name)));
    if (taken) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s already holds an export (%s)", out_dir, name));
    }
  }
  // 2
  std::vector<OutFile> files = LayOutFiles(tensors, options.max_shard_bytes);
  std::vector<std::string> hashes(tensors.size(),
                                  std::string(kHashHexDigits, '0'));
  for (OutFile& file : files) {
    ASSIGN_OR_RETURN(bool taken, storage->Exists(JoinPath(out_dir, file.name)));
    if (taken) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s already holds %s", out_dir, file.name));
    }
    file.header_bytes =
        static_cast<int64_t>(HeaderText(tensors, file, step, hashes).size());
    int64_t at = 8 + file.header_bytes;
    for (int t : file.tensors) {
      tensors[t].offset = at;
      at += tensors[t].bytes;
    }
  }
  std::vector<std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>> states;
  for (Tensor& tensor : tensors) {
    states.emplace_back(XXH3_createState(), &XXH3_freeState);
    tensor.hash = states.back().get();
    XXH3_64bits_reset(tensor.hash);
  }
  auto remove_tmp = [&] {
    for (OutFile& file : files) {
      if (file.file != nullptr) file.file->Close().IgnoreError();
      if (!file.tmp_path.empty()) {
        storage->RemoveAll(file.tmp_path).IgnoreError();
      }
    }
  };
  int64_t bytes_read = 0;
  absl::Status status = [&]() -> absl::Status {
    for (OutFile& file : files) {
      file.tmp_path =
          JoinPath(out_dir, absl::StrFormat(".%s.tmp-%d", file.name, getpid()));
      ASSIGN_OR_RETURN(file.file, storage->OpenWritable(file.tmp_path));
    }
    // 3
    // A chunk's buffer holds the previous chunk's unwritten tail (less
    // than a block) in front of it.
    const int64_t chunk_bytes = options.memory_bytes / 2 - kBlockBytes;
    std::vector<Chunk> chunks = CutChunks(tensors, files, chunk_bytes);
    AlignedBytes buffers[2] = {AlignedBytes(chunk_bytes + kBlockBytes),
                               AlignedBytes(chunk_bytes + kBlockBytes)};
    std::future<absl::Status> writing;
    int64_t carry = 0;  // of the chunk being read
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Chunk& chunk = chunks[c];
      uint8_t* buffer = buffers[c % 2].data();
      std::vector<RestoreTarget> targets;
      int64_t at = carry;
      for (const Piece& piece : chunk.pieces) {
        const ManifestArray& array = *tensors[piece.tensor].array;
        targets.push_back({array.name,
                           array.dtype,
                           array.shape,
                           {{piece.box, nullptr, buffer + at}}});
        at += piece.bytes;
      }
      absl::StatusOr<RestoreStats> read = root->Read(step, targets);
      if (writing.valid()) RETURN_IF_ERROR(writing.get());
      RETURN_IF_ERROR(read.status());
      bytes_read += read->bytes_read;
      const bool last_of_file =
          c + 1 == chunks.size() || chunks[c + 1].file != chunk.file;
      // The tail that the next chunk's buffer carries (the other buffer,
      // whose write has just finished).
      const int64_t tail = last_of_file ? 0 : at % kBlockBytes;
      std::memcpy(buffers[(c + 1) % 2].data(), buffer + at - tail, tail);
      writing =
          std::async(std::launch::async, [&, c, buffer, carry, last_of_file] {
            return WriteChunk(chunks[c], last_of_file, buffer, carry, tensors,
                              files[chunks[c].file]);
          });
      carry = tail;
    }
    if (writing.valid()) RETURN_IF_ERROR(writing.get());
    // 4
    for (size_t t = 0; t < tensors.size(); ++t) {
      hashes[t] = absl::StrFormat("%016x", XXH3_64bits_digest(tensors[t].hash));
    }
    for (OutFile& file : files) {
      const std::string header = HeaderText(tensors, file, step, hashes);
      std::string prefix(8, '\0');
      uint64_t length = header.size();
      for (int i = 0; i < 8; ++i)
        prefix[i] = static_cast<char>(length >> (8 * i));
      prefix += header;
      RETURN_IF_ERROR(file.file->WriteAt(
          0,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(prefix.data()),
                              prefix.size())));
      RETURN_IF_ERROR(file.file->Sync());
      RETURN_IF_ERROR(file.file->Close());
      file.file.reset();
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    remove_tmp();
    return status;
  }
  ExportStats stats;
  for (OutFile& file : files) {
    RETURN_IF_ERROR(
        storage->Rename(file.tmp_path, JoinPath(out_dir, file.name)));
    file.tmp_path.clear();
    stats.files.push_back(JoinPath(out_dir, file.name));
  }
  if (files.size() > 1) {
    nlohmann::ordered_json index;
    int64_t total = 0;
    for (const Tensor& tensor : tensors) total += tensor.bytes;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (const Tensor& tensor : tensors) {
      index["weight_map"][tensor.name] = files[tensor.file].name;
    }
    const std::string text = index.dump(2) + "\n";
    const std::string tmp = JoinPath(
        out_dir,
        absl::StrFormat(".%s.tmp-%d", kSafetensorsIndexFile, getpid()));
    ASSIGN_OR_RETURN(auto out, storage->OpenWritable(tmp));
    absl::Status written = out->WriteAt(
        0, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
    if (written.ok()) written = out->Sync();
    out->Close().IgnoreError();
    if (written.ok()) {
      written = storage->Rename(tmp, JoinPath(out_dir, kSafetensorsIndexFile));
    }
    if (!written.ok()) {
      storage->RemoveAll(tmp).IgnoreError();
      return written;
    }
    stats.files.push_back(JoinPath(out_dir, kSafetensorsIndexFile));
  }
  RETURN_IF_ERROR(storage->SyncDir(out_dir));
  stats.tensors = static_cast<int64_t>(tensors.size());
  stats.bytes_read = bytes_read;
  for (const Tensor& tensor : tensors) stats.bytes += tensor.bytes;
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace hoist
