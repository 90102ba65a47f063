// The parts of a safetensors export (safetensors_export.cc): the tensors
// and files laid out, the chunks they are cut into, the reader that streams
// a step's extents into them (hashes checked) and the writers that drain
// them. Private to interop/.
#ifndef HOIST_INTEROP_EXPORT_STREAMS_H_
#define HOIST_INTEROP_EXPORT_STREAMS_H_

#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"
#include "hoist/box.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/format/extent_hash.h"
#include "hoist/manifest.h"
#include "hoist/mutex.h"
#include "hoist/storage.h"

namespace hoist::export_internal {

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

}  // namespace hoist::export_internal

#endif  // HOIST_INTEROP_EXPORT_STREAMS_H_
