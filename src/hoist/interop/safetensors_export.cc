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
//      outermost axis whose rows fit) and the pieces into chunks that fill
//      most of the memory; a chunk never crosses a file. Read a chunk
//      (ExtentStreamer: every extent's bytes once, in order, however the
//      pieces cut it, its hash checked at its last byte) while the writer
//      thread writes the previous one, hashing each tensor's bytes in order
//      while its direct writes are in flight.
//   4. Write each file's header with the hashes at offset 0, fsync, close,
//      rename the file from its temporary name into place; then the index
//      (when there is more than one file), the same way; fsync out_dir.
//      Into an object store (an object is uploaded from start to end, under
//      its final name, and appears when complete): step 3 reads and hashes
//      only, then each file's header is uploaded first, step 3 runs again
//      uploading every file in order (one writer thread) and re-hashing,
//      and each upload is completed once the hashes agree.
// On error the files begun are removed (aborted uploads) and no final name
// was made.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <unordered_map>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/interop.h"
#include "hoist/interop/export_streams.h"
#include "hoist/interop/safetensors_names.h"
#include "hoist/io/io_sizes.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

using export_internal::Chunk;
using export_internal::ExtentStreamer;
using export_internal::kBlockBytes;
using export_internal::kBuffers;
using export_internal::kHashHexDigits;
using export_internal::kReaderThreads;
using export_internal::kWriteBytes;
using export_internal::kWriteThreads;
using export_internal::OutFile;
using export_internal::Piece;
using export_internal::Tensor;
using export_internal::WriteQueue;

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

// The pieces of `tensor` of at most `limit` bytes each, in C order (see
// ForEachContiguousPiece): each spans the tensor's inner axes whole.
std::vector<Piece> PiecesOf(int t, const Tensor& tensor, int64_t limit) {
  const int64_t item = ItemSize(tensor.array->dtype);
  std::vector<Piece> pieces;
  ForEachContiguousPiece(
      Box::FromShape(tensor.array->shape), item, limit,
      [&](const Box& box) {
        pieces.push_back({t, box, box.num_elements() * item});
        return absl::OkStatus();
      })
      .IgnoreError();  // the callback never fails
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

// One export, as the steps of this file's comment.
class Exporter {
 public:
  Exporter(const SafetensorsExportOptions& options, std::string out_dir)
      : options_(options), out_dir_(std::move(out_dir)) {}

  // 1. The step's manifest read and its arrays selected; `out_dir` made
  // (or found empty of an export).
  absl::Status Open(const std::string& step_dir) {
    ASSIGN_OR_RETURN(auto opened, OpenStepAt(step_dir, options_.storage));
    root_ = std::move(opened.first);
    step_ = opened.second;
    ASSIGN_OR_RETURN(manifest_, root_->ReadManifest(step_));
    ASSIGN_OR_RETURN(tensors_, SelectTensors(manifest_, options_.prefix));
    // The local disk, or an object store. A file that cannot be renamed (an
    // object) is written under its own name and appears whole when its
    // upload completes. One that is written from its start to its end (an
    // object again) has its header (which holds the hashes) first, so the
    // bytes are read twice: hashed, then written behind the header.
    ASSIGN_OR_RETURN(storage_, OpenStorage(out_dir_, options_.storage));
    const StorageCapabilities can = storage_->capabilities();
    renames_ = can.atomic_rename;
    sequential_ = !can.random_writes;
    ASSIGN_OR_RETURN(bool out_exists, storage_->Exists(out_dir_));
    if (!out_exists) {
      // A directory of its own on a filesystem; on an object store the
      // bucket must exist (a prefix needs no object).
      return can.local ? storage_->CreateDir(out_dir_)
                       : storage_->CreateDirs(out_dir_);
    }
    ASSIGN_OR_RETURN(bool out_is_dir, storage_->IsDir(out_dir_));
    if (!out_is_dir) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is not a directory", out_dir_));
    }
    for (const char* name : {kSafetensorsSingleFile, kSafetensorsIndexFile}) {
      RETURN_IF_ERROR(RefuseTaken(name, "an export (%s)"));
    }
    return absl::OkStatus();
  }

  // 2. The files laid out: each header's length and every tensor's offset.
  absl::Status LayOut() {
    files_ = LayOutFiles(tensors_, options_.max_shard_bytes);
    hashes_.assign(tensors_.size(), std::string(kHashHexDigits, '0'));
    for (OutFile& file : files_) {
      RETURN_IF_ERROR(RefuseTaken(file.name, "%s"));
      file.header_bytes = static_cast<int64_t>(
          HeaderText(tensors_, file, step_, hashes_).size());
      int64_t at = 8 + file.header_bytes;
      for (int t : file.tensors) {
        tensors_[t].offset = at;
        at += tensors_[t].bytes;
      }
    }
    for (Tensor& tensor : tensors_) {
      states_.emplace_back(XXH3_createState(), &XXH3_freeState);
      tensor.hash = states_.back().get();
      XXH3_64bits_reset(tensor.hash);
    }
    return absl::OkStatus();
  }

  // 3 and 4: every file written, its header last (first on an object
  // store), durable and closed; on an error, what was begun is removed.
  absl::Status WriteFiles() {
    absl::Status status = WriteFilesOrFail();
    if (!status.ok()) RemoveBegun();
    return status;
  }

  // 4. The files under their names, then the index (for several files),
  // `out_dir` synced.
  absl::StatusOr<ExportStats> Publish() {
    ExportStats stats;
    for (OutFile& file : files_) {
      if (renames_) {
        RETURN_IF_ERROR(
            storage_->Rename(file.tmp_path, JoinPath(out_dir_, file.name)));
      }
      file.tmp_path.clear();
      stats.files.push_back(JoinPath(out_dir_, file.name));
    }
    if (files_.size() > 1) {
      RETURN_IF_ERROR(WriteIndex());
      stats.files.push_back(JoinPath(out_dir_, kSafetensorsIndexFile));
    }
    RETURN_IF_ERROR(storage_->SyncDir(out_dir_));
    stats.tensors = static_cast<int64_t>(tensors_.size());
    stats.bytes_read = bytes_read_;
    for (const Tensor& tensor : tensors_) stats.bytes += tensor.bytes;
    return stats;
  }

 private:
  // kAlreadyExists when `out_dir` holds `name` (`what` names it).
  absl::Status RefuseTaken(const std::string& name,
                           const absl::FormatSpec<std::string>& what) {
    ASSIGN_OR_RETURN(bool taken, storage_->Exists(JoinPath(out_dir_, name)));
    if (!taken) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat(out_dir_, " already holds ", absl::StrFormat(what, name)));
  }

  // Where `name` is written: a temporary name beside it, unless the
  // storage cannot rename (an object is uploaded under its name).
  std::string WrittenAs(const std::string& name) const {
    if (!renames_) return JoinPath(out_dir_, name);
    return JoinPath(out_dir_, absl::StrFormat(".%s.tmp-%d", name, getpid()));
  }

  absl::Status WriteFilesOrFail() {
    for (OutFile& file : files_) {
      file.tmp_path = WrittenAs(file.name);
      ASSIGN_OR_RETURN(file.file, storage_->OpenWritable(file.tmp_path));
      // Room for the whole file now: a full disk fails here, before any
      // byte moves, and the direct writes need not allocate.
      RETURN_IF_ERROR(
          file.file->Reserve(0, 8 + file.header_bytes + file.data_bytes));
    }
    // 3. The memory: a sixteenth (at most kMaxIoRunBytes) for each
    // reader's buffer, the rest for kBuffers chunks, each behind the
    // previous chunk's unwritten tail (less than a block).
    run_bytes_ = std::min(kMaxIoRunBytes, options_.memory_bytes / 16);
    chunk_bytes_ =
        (options_.memory_bytes - kReaderThreads * run_bytes_) / kBuffers -
        kBlockBytes;
    ASSIGN_OR_RETURN(step_dir_, root_->StepDir(step_));
    chunks_ = CutChunks(tensors_, files_, chunk_bytes_);
    buffers_.resize(kBuffers);  // not zeroed: every byte written is read
    if (options_.progress != nullptr) {
      int64_t total = 0;
      for (const Tensor& tensor : tensors_) total += tensor.bytes;
      options_.progress->total.store(sequential_ ? 2 * total : total);
    }
    // 4
    if (!sequential_) {
      RETURN_IF_ERROR(Stream(/*write=*/true));
      hashes_ = Digests();
      RETURN_IF_ERROR(WriteHeaders());
      return FinishFiles();
    }
    RETURN_IF_ERROR(Stream(/*write=*/false));
    hashes_ = Digests();
    RETURN_IF_ERROR(WriteHeaders());
    RETURN_IF_ERROR(Stream(/*write=*/true));
    // The bytes uploaded are the bytes hashed (a committed step does not
    // change; this says so before any object is completed).
    if (Digests() != hashes_) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the step's bytes changed between the two reads of the export",
          step_dir_));
    }
    return FinishFiles();
  }

  // Reads every chunk and hashes it; with `write`, writes it too. An
  // object is written by one thread, in order (after its header).
  absl::Status Stream(bool write) {
    for (Tensor& tensor : tensors_) XXH3_64bits_reset(tensor.hash);
    ExtentStreamer streamer(root_->storage(), step_dir_, kReaderThreads,
                            run_bytes_);
    // After `buffers_`: its threads stop before the buffers go.
    WriteQueue writes(sequential_ ? 1 : kWriteThreads);
    const uint8_t* tail = nullptr;  // the previous chunk's, in its buffer
    int64_t carry = 0;              // its length
    for (size_t c = 0; c < chunks_.size(); ++c) {
      const Chunk& chunk = chunks_[c];
      OutFile& file = files_[chunk.file];
      uint8_t* buffer = buffers_[c % kBuffers].Get(chunk_bytes_ + kBlockBytes);
      if (c >= kBuffers) RETURN_IF_ERROR(writes.Wait(c - kBuffers));
      if (carry > 0) std::memcpy(buffer, tail, carry);
      RETURN_IF_ERROR(streamer.Read(chunk.pieces, tensors_, buffer + carry));
      int64_t at = carry;
      for (const Piece& piece : chunk.pieces) {
        XXH3_64bits_update(tensors_[piece.tensor].hash, buffer + at,
                           piece.bytes);
        at += piece.bytes;
      }
      if (options_.progress != nullptr) {
        options_.progress->current.Set(file.name);
        options_.progress->done.fetch_add(at - carry);
      }
      // Every whole block goes out directly, in writes of kWriteBytes; the
      // rest (less than a block) is the next chunk's carry, or, after a
      // file's last chunk, written through the page cache.
      const int64_t base = chunk.file_offset - carry;
      const int64_t whole = at / kBlockBytes * kBlockBytes;
      for (int64_t from = 0; write && from < whole; from += kWriteBytes) {
        writes.Add(c, file.file.get(), base + from,
                   absl::MakeConstSpan(buffer + from,
                                       std::min(kWriteBytes, whole - from)));
      }
      const bool last_of_file =
          c + 1 == chunks_.size() || chunks_[c + 1].file != chunk.file;
      if (write && last_of_file && at > whole) {
        writes.Add(c, file.file.get(), base + whole,
                   absl::MakeConstSpan(buffer + whole, at - whole));
      }
      tail = buffer + whole;
      carry = last_of_file ? 0 : at - whole;
    }
    if (!chunks_.empty()) RETURN_IF_ERROR(writes.Wait(chunks_.size() - 1));
    bytes_read_ += streamer.bytes_read();
    return absl::OkStatus();
  }

  // The header of each file at its offset 0, its hashes as `hashes_` holds
  // them.
  absl::Status WriteHeaders() {
    for (OutFile& file : files_) {
      const std::string header = HeaderText(tensors_, file, step_, hashes_);
      std::string prefix(8, '\0');
      uint64_t length = header.size();
      for (int i = 0; i < 8; ++i) {
        prefix[i] = static_cast<char>(length >> (8 * i));
      }
      prefix += header;
      RETURN_IF_ERROR(file.file->WriteAt(
          0,
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(prefix.data()),
                              prefix.size())));
    }
    return absl::OkStatus();
  }

  // Every file made durable (an object: its upload completed) and closed.
  absl::Status FinishFiles() {
    for (OutFile& file : files_) {
      RETURN_IF_ERROR(file.file->Sync());
      RETURN_IF_ERROR(file.file->Close());
      file.file.reset();
    }
    return absl::OkStatus();
  }

  // Each tensor's digest, as 16 hex digits.
  std::vector<std::string> Digests() const {
    std::vector<std::string> out;
    for (const Tensor& tensor : tensors_) {
      out.push_back(absl::StrFormat("%016x", XXH3_64bits_digest(tensor.hash)));
    }
    return out;
  }

  void RemoveBegun() {
    for (OutFile& file : files_) {
      if (file.file != nullptr) file.file->Close().IgnoreError();
      if (!file.tmp_path.empty()) {
        storage_->RemoveAll(file.tmp_path).IgnoreError();
      }
    }
  }

  // model.safetensors.index.json: the total size and each tensor's file.
  absl::Status WriteIndex() {
    nlohmann::ordered_json index;
    int64_t total = 0;
    for (const Tensor& tensor : tensors_) total += tensor.bytes;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json::object();
    for (const Tensor& tensor : tensors_) {
      index["weight_map"][tensor.name] = files_[tensor.file].name;
    }
    const std::string text = index.dump(2) + "\n";
    const std::string tmp = WrittenAs(kSafetensorsIndexFile);
    ASSIGN_OR_RETURN(auto out, storage_->OpenWritable(tmp));
    absl::Status written = out->WriteAt(
        0, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
    if (written.ok()) written = out->Sync();
    out->Close().IgnoreError();
    if (written.ok() && renames_) {
      written =
          storage_->Rename(tmp, JoinPath(out_dir_, kSafetensorsIndexFile));
    }
    if (!written.ok()) storage_->RemoveAll(tmp).IgnoreError();
    return written;
  }

  const SafetensorsExportOptions& options_;
  const std::string out_dir_;
  std::unique_ptr<CheckpointRoot> root_;
  int64_t step_ = 0;
  std::string step_dir_;
  Manifest manifest_;  // tensors_ point into it
  std::vector<Tensor> tensors_;
  std::vector<OutFile> files_;
  std::vector<std::string> hashes_;
  std::vector<std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)>> states_;
  std::unique_ptr<Storage> storage_;
  bool renames_ = true;      // files are written aside, then renamed
  bool sequential_ = false;  // files are written start to end
  int64_t run_bytes_ = 0;    // a reader's buffer
  int64_t chunk_bytes_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<ReadBuffer> buffers_;
  int64_t bytes_read_ = 0;
};

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
  Exporter exporter(options, out_dir);
  RETURN_IF_ERROR(exporter.Open(step_dir));
  RETURN_IF_ERROR(exporter.LayOut());
  RETURN_IF_ERROR(exporter.WriteFiles());
  ASSIGN_OR_RETURN(ExportStats stats, exporter.Publish());
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace hoist
