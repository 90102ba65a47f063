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
#include "hoist/io/io_sizes.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/interop.h"
#include "hoist/interop/safetensors_names.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

constexpr int kHashHexDigits = 16;
// Writes whose offset, length and memory are multiples of this go straight
// to the disk (O_DIRECT).
constexpr int64_t kBlockBytes = 4096;
// Chunks read, hashed or being written at once: while one is read, the
// writes of the others keep the disk's queue full.
constexpr int kBuffers = 4;
// Threads writing at once, and the bytes of one write.
constexpr int kWriteThreads = 8;
constexpr int64_t kWriteBytes = int64_t{8} << 20;
// Threads reading extents at once.
constexpr int kReaderThreads = 4;

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
  std::string tmp_path;  // where it is written (on an object store: its name)
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

// Reads chunks' pieces from the step's extents, every extent's bytes once
// and in order however the pieces cut it. A piece spans its tensor's inner
// axes whole, so its part of any extent is one run of the extent's bytes;
// a tensor's pieces come in C order, so each extent is read front to back
// across chunks, its XXH3 carried from one run to the next and checked at
// its last byte (a mismatch fails the export, whose files then never get
// their names). Runs of an extent are read in order by one thread; up to
// `threads` extents at once, each run straight into the chunk where its
// bytes lie contiguously there, else through a buffer of at most
// `run_bytes` a thread.
class ExtentStreamer {
 public:
  ExtentStreamer(Storage& storage, std::string step_dir, int threads,
                 int64_t run_bytes)
      : storage_(storage),
        step_dir_(std::move(step_dir)),
        run_bytes_(run_bytes),
        buffers_(static_cast<size_t>(threads)) {}

  // Fills `pieces`, which lie one after the other from `data`.
  absl::Status Read(const std::vector<Piece>& pieces,
                    const std::vector<Tensor>& tensors, uint8_t* data) {
    // The runs, grouped by extent in the order the pieces meet them.
    std::vector<std::vector<Run>> groups;
    absl::flat_hash_map<const ManifestExtent*, size_t> group_of;
    for (const Piece& piece : pieces) {
      const ManifestArray& array = *tensors[piece.tensor].array;
      const int64_t item = ItemSize(array.dtype);
      for (const ManifestExtent& extent : array.extents) {
        const Box part = piece.box.Intersect(extent.box);
        if (part.empty()) continue;
        Stream& stream = streams_[&extent];
        const ExtentPlace place = PlaceOfExtent(step_dir_, extent);
        if (stream.hash == nullptr) {
          stream.hash = std::make_unique<ExtentHasher>(extent.hash);
          stream.where =
              absl::StrFormat("array '%s': extent at %s @ %d", array.name,
                              place.relative, extent.offset_bytes);
        }
        ASSIGN_OR_RETURN(ReadableFile * file, File(place, stream.where));
        const size_t group =
            group_of.try_emplace(&extent, groups.size()).first->second;
        if (group == groups.size()) groups.emplace_back();
        RETURN_IF_ERROR(
            ForEachContiguousPiece(part, item, run_bytes_, [&](const Box& box) {
              groups[group].push_back(
                  {&extent, &stream, file, box, item,
                   *ContiguousByteOffset(extent.box, box, item), data,
                   &piece.box});
              return absl::OkStatus();
            }));
      }
      data += piece.bytes;
    }
    FirstError error;
    std::atomic<size_t> next{0};
    const auto reader = [&](ReadBuffer& buffer) {
      for (size_t g = next.fetch_add(1); g < groups.size() && error.Get().ok();
           g = next.fetch_add(1)) {
        for (const Run& run : groups[g]) {
          if (absl::Status s = ReadRun(run, buffer); !s.ok()) {
            error.Record(std::move(s));
            return;
          }
        }
      }
    };
    const size_t threads = std::min(buffers_.size(), groups.size());
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) {
      pool.emplace_back(reader, std::ref(buffers_[i]));
    }
    if (threads > 0) reader(buffers_[0]);
    for (std::thread& t : pool) t.join();
    RETURN_IF_ERROR(error.Get());
    for (auto it = streams_.begin(); it != streams_.end();) {
      auto here = it++;
      if (here->second.done == here->first->length_bytes) {
        streams_.erase(here);
      }
    }
    return absl::OkStatus();
  }

  int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  struct Stream {
    std::unique_ptr<ExtentHasher> hash;
    int64_t done = 0;  // bytes of the extent read so far
    std::string where;
  };
  // A run of an extent's bytes: `box` of the array, at `offset` in the
  // extent, bound for `piece_box`'s bytes at `piece_data`.
  struct Run {
    const ManifestExtent* extent;
    Stream* stream;
    ReadableFile* file;
    Box box;
    int64_t item;
    int64_t offset;
    uint8_t* piece_data;
    const Box* piece_box;
  };

  absl::StatusOr<ReadableFile*> File(const ExtentPlace& place,
                                     const std::string& where) {
    std::unique_ptr<ReadableFile>& file = files_[place.path];
    if (file == nullptr) {
      absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
          storage_.OpenReadableBeneath(place.dir, place.relative);
      if (!opened.ok()) {
        files_.erase(place.path);
        return absl::Status(
            opened.status().code(),
            absl::StrCat(where, ": ", opened.status().message()));
      }
      file = *std::move(opened);
    }
    return file.get();
  }

  absl::Status ReadRun(const Run& run, ReadBuffer& buffer) {
    Stream& stream = *run.stream;
    const int64_t length = run.box.num_elements() * run.item;
    if (run.offset != stream.done) {
      return absl::InternalError(
          absl::StrFormat("%s: read at %d after %d bytes of it (out of order)",
                          stream.where, run.offset, stream.done));
    }
    const std::optional<int64_t> in_piece =
        ContiguousByteOffset(*run.piece_box, run.box, run.item);
    uint8_t* bytes = in_piece ? run.piece_data + *in_piece : buffer.Get(length);
    if (absl::Status s = run.file->ReadAt(run.extent->offset_bytes + run.offset,
                                          absl::MakeSpan(bytes, length));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(stream.where, ": ", s.message()));
    }
    stream.hash->Update(bytes, length);
    stream.done += length;
    bytes_read_.fetch_add(length);
    if (stream.done == run.extent->length_bytes && !stream.hash->Matches()) {
      return absl::DataLossError(
          absl::StrFormat("%s: xxh3 mismatch", stream.where));
    }
    if (!in_piece) {
      CopyBox(bytes, run.box, run.piece_data, *run.piece_box, run.box,
              run.item);
    }
    return absl::OkStatus();
  }

  Storage& storage_;
  const std::string step_dir_;
  const int64_t run_bytes_;
  std::vector<ReadBuffer> buffers_;
  absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files_;
  // Extents begun and not yet finished; node-based, so a Run's pointer
  // stays valid while other streams are added and removed.
  std::unordered_map<const ManifestExtent*, Stream> streams_;
  std::atomic<int64_t> bytes_read_{0};
};

// Writes taken in order by `threads` threads, each write counted against
// its chunk, so that a chunk's buffer is reused only when all of its writes
// are done while later chunks' writes keep the disk busy.
class WriteQueue {
 public:
  explicit WriteQueue(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  // Drops the writes not yet begun and waits for those under way.
  ~WriteQueue() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      queue_.clear();
    }
    for (std::thread& thread : threads_) thread.join();
  }

  void Add(int64_t chunk, WritableFile* file, int64_t offset,
           absl::Span<const uint8_t> data) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    ++pending_[chunk];
    queue_.push_back({chunk, file, offset, data});
  }

  // Waits until every write of chunks up to `chunk` is done; the first
  // error of any write so far.
  absl::Status Wait(int64_t chunk) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    awaited_ = chunk;
    mu_.Await(Condition(this, &WriteQueue::AwaitedDone));
    return error_;
  }

 private:
  struct Write {
    int64_t chunk;
    WritableFile* file;
    int64_t offset;
    absl::Span<const uint8_t> data;
  };

  bool AwaitedDone() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !error_.ok() || pending_.empty() ||
           pending_.begin()->first > awaited_;
  }
  bool HasWorkOrStopping() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return stopping_ || !queue_.empty();
  }

  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      Write write;
      {
        MutexLock lock(&mu_);
        mu_.Await(Condition(this, &WriteQueue::HasWorkOrStopping));
        if (queue_.empty()) return;
        write = queue_.front();
        queue_.pop_front();
        if (!error_.ok()) {
          if (--pending_[write.chunk] == 0) pending_.erase(write.chunk);
          continue;
        }
      }
      absl::Status written = write.file->WriteAt(write.offset, write.data);
      MutexLock lock(&mu_);
      error_.Update(written);
      if (--pending_[write.chunk] == 0) pending_.erase(write.chunk);
    }
  }

  Mutex mu_;
  std::deque<Write> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> pending_ ABSL_GUARDED_BY(mu_);  // by chunk
  int64_t awaited_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
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
  // 1
  ASSIGN_OR_RETURN(auto opened, OpenStepAt(step_dir, options.storage));
  const std::unique_ptr<CheckpointRoot>& root = opened.first;
  const int64_t step = opened.second;
  ASSIGN_OR_RETURN(const Manifest manifest, root->ReadManifest(step));
  ASSIGN_OR_RETURN(std::vector<Tensor> tensors,
                   SelectTensors(manifest, options.prefix));
  // The local disk, or an object store. A file that cannot be renamed (an
  // object) is written under its own name and appears whole when its upload
  // completes. One that is written from its start to its end (an object
  // again) has its header (which holds the hashes) first, so the bytes are
  // read twice: hashed, then written behind the header.
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage,
                   OpenStorage(out_dir, options.storage));
  const StorageCapabilities can = storage->capabilities();
  const bool renames = can.atomic_rename;
  const bool sequential = !can.random_writes;
  ASSIGN_OR_RETURN(bool out_exists, storage->Exists(out_dir));
  if (!out_exists) {
    // A directory of its own on a filesystem; on an object store the bucket
    // must exist (a prefix needs no object).
    RETURN_IF_ERROR(can.local ? storage->CreateDir(out_dir)
                              : storage->CreateDirs(out_dir));
  } else {
    ASSIGN_OR_RETURN(bool out_is_dir, storage->IsDir(out_dir));
    if (!out_is_dir) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is not a directory", out_dir));
    }
  }
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
  // The header of each file at its offset 0, its hashes as `hashes` holds
  // them.
  auto write_headers = [&]() -> absl::Status {
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
    }
    return absl::OkStatus();
  };
  // Every file made durable (an object: its upload completed) and closed.
  auto finish_files = [&]() -> absl::Status {
    for (OutFile& file : files) {
      RETURN_IF_ERROR(file.file->Sync());
      RETURN_IF_ERROR(file.file->Close());
      file.file.reset();
    }
    return absl::OkStatus();
  };
  // Each tensor's digest, as 16 hex digits.
  auto digests = [&] {
    std::vector<std::string> out;
    for (const Tensor& tensor : tensors) {
      out.push_back(absl::StrFormat("%016x", XXH3_64bits_digest(tensor.hash)));
    }
    return out;
  };
  int64_t bytes_read = 0;
  absl::Status status = [&]() -> absl::Status {
    for (OutFile& file : files) {
      file.tmp_path =
          !renames ? JoinPath(out_dir, file.name)
                   : JoinPath(out_dir, absl::StrFormat(".%s.tmp-%d", file.name,
                                                       getpid()));
      ASSIGN_OR_RETURN(file.file, storage->OpenWritable(file.tmp_path));
      // Room for the whole file now: a full disk fails here, before any
      // byte moves, and the direct writes need not allocate.
      RETURN_IF_ERROR(
          file.file->Reserve(0, 8 + file.header_bytes + file.data_bytes));
    }
    // 3
    // The memory: a sixteenth (at most kMaxIoRunBytes) for each reader's
    // buffer, the rest for kBuffers chunks, each behind the previous
    // chunk's unwritten tail (less than a block).
    const int64_t run_bytes =
        std::min(kMaxIoRunBytes, options.memory_bytes / 16);
    const int64_t chunk_bytes =
        (options.memory_bytes - kReaderThreads * run_bytes) / kBuffers -
        kBlockBytes;
    ASSIGN_OR_RETURN(const std::string dir, root->StepDir(step));
    std::vector<Chunk> chunks = CutChunks(tensors, files, chunk_bytes);
    // Not zeroed: every byte written is read first.
    std::vector<ReadBuffer> buffers(kBuffers);
    // Reads every chunk and hashes it; with `write`, writes it too. An
    // object is written by one thread, in order (after its header).
    auto stream = [&](bool write) -> absl::Status {
      for (Tensor& tensor : tensors) XXH3_64bits_reset(tensor.hash);
      ExtentStreamer streamer(root->storage(), dir, kReaderThreads, run_bytes);
      // After `buffers`: its threads stop before the buffers go.
      WriteQueue writes(sequential ? 1 : kWriteThreads);
      const uint8_t* tail = nullptr;  // the previous chunk's, in its buffer
      int64_t carry = 0;              // its length
      for (size_t c = 0; c < chunks.size(); ++c) {
        const Chunk& chunk = chunks[c];
        OutFile& file = files[chunk.file];
        uint8_t* buffer = buffers[c % kBuffers].Get(chunk_bytes + kBlockBytes);
        if (c >= kBuffers) RETURN_IF_ERROR(writes.Wait(c - kBuffers));
        if (carry > 0) std::memcpy(buffer, tail, carry);
        RETURN_IF_ERROR(streamer.Read(chunk.pieces, tensors, buffer + carry));
        int64_t at = carry;
        for (const Piece& piece : chunk.pieces) {
          XXH3_64bits_update(tensors[piece.tensor].hash, buffer + at,
                             piece.bytes);
          at += piece.bytes;
        }
        // Every whole block goes out directly, in writes of kWriteBytes;
        // the rest (less than a block) is the next chunk's carry, or, after
        // a file's last chunk, written through the page cache.
        const int64_t base = chunk.file_offset - carry;
        const int64_t whole = at / kBlockBytes * kBlockBytes;
        for (int64_t from = 0; write && from < whole; from += kWriteBytes) {
          writes.Add(c, file.file.get(), base + from,
                     absl::MakeConstSpan(buffer + from,
                                         std::min(kWriteBytes, whole - from)));
        }
        const bool last_of_file =
            c + 1 == chunks.size() || chunks[c + 1].file != chunk.file;
        if (write && last_of_file && at > whole) {
          writes.Add(c, file.file.get(), base + whole,
                     absl::MakeConstSpan(buffer + whole, at - whole));
        }
        tail = buffer + whole;
        carry = last_of_file ? 0 : at - whole;
      }
      if (!chunks.empty()) RETURN_IF_ERROR(writes.Wait(chunks.size() - 1));
      bytes_read += streamer.bytes_read();
      return absl::OkStatus();
    };
    // 4
    if (!sequential) {
      RETURN_IF_ERROR(stream(/*write=*/true));
      hashes = digests();
      RETURN_IF_ERROR(write_headers());
      return finish_files();
    }
    RETURN_IF_ERROR(stream(/*write=*/false));
    hashes = digests();
    RETURN_IF_ERROR(write_headers());
    RETURN_IF_ERROR(stream(/*write=*/true));
    // The bytes uploaded are the bytes hashed (a committed step does not
    // change; this says so before any object is completed).
    if (digests() != hashes) {
      return absl::DataLossError(absl::StrFormat(
          "%s: the step's bytes changed between the two reads of the export",
          dir));
    }
    return finish_files();
  }();
  if (!status.ok()) {
    remove_tmp();
    return status;
  }
  ExportStats stats;
  for (OutFile& file : files) {
    if (renames) {
      RETURN_IF_ERROR(
          storage->Rename(file.tmp_path, JoinPath(out_dir, file.name)));
    }
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
    const std::string tmp =
        !renames ? JoinPath(out_dir, kSafetensorsIndexFile)
                 : JoinPath(out_dir,
                            absl::StrFormat(".%s.tmp-%d", kSafetensorsIndexFile,
                                            getpid()));
    ASSIGN_OR_RETURN(auto out, storage->OpenWritable(tmp));
    absl::Status written = out->WriteAt(
        0, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()),
                               text.size()));
    if (written.ok()) written = out->Sync();
    out->Close().IgnoreError();
    if (written.ok() && renames) {
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
