// The receiving side of a peer shift (peer_shift.h): the files a peer
// streams, written in order as the bytes arrive.
//
// The coordinator's pieces start anywhere in memory and split the stream at
// any byte, so written as they come they would go through the page cache
// (0.36 GB/s on this project's VM, where O_DIRECT writes reach 1.2 GB/s).
// FileStream copies them into 4 KiB-aligned staging buffers instead and
// writes each file from them at multiples of their size, which POSIX
// storage writes O_DIRECT (an unaligned tail buffered). A thread of its own
// writes (and hands the bytes to `seen`) while the caller goes back to the
// coordinator for the next piece: the transfer and the disk overlap, and
// the coordinator's peer is never kept waiting on a write.
#ifndef HOIST_CHECKPOINT_TIER_FILE_STREAM_H_
#define HOIST_CHECKPOINT_TIER_FILE_STREAM_H_

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "hoist/mutex.h"
#include "hoist/storage.h"

namespace hoist {

// Sees every byte of the files a shift receives, in order: the file's path
// (as sent), the offset of `bytes` in it. Called (on FileStream's thread)
// before they are written, with memory just filled, so hashing them there
// costs no read.
using ReceivedBytes = std::function<void(
    const std::string& path, int64_t offset, absl::Span<const uint8_t> bytes)>;

class FileStream {
 public:
  static constexpr size_t kStagingBytes = size_t{8} << 20;
  static constexpr int kStagingBuffers = 4;  // 32 MiB in all

  // `files`, `paths` and `sizes`: of each file, in the stream's order;
  // `seen` (may be empty) sees each byte before it is written.
  FileStream(std::vector<std::unique_ptr<WritableFile>> files,
             std::vector<std::string> paths, std::vector<int64_t> sizes,
             ReceivedBytes seen);
  ~FileStream();  // waits for the writes in flight
  FileStream(const FileStream&) = delete;
  FileStream& operator=(const FileStream&) = delete;

  // Appends `piece` to the stream, waiting only while every staging buffer
  // is being written. kDataLoss past the files' end; a write's error (the
  // first), once it happened; kResourceExhausted without memory.
  absl::Status Append(absl::Span<const uint8_t> piece);

  // Writes what is staged, waits for every write and syncs every file (the
  // caller has checked that the stream held all their bytes).
  absl::Status Finish();

  // Closes every file, after the writes in flight: the first error.
  absl::Status Close();

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  using Buffer = std::unique_ptr<uint8_t, Free>;
  struct Write {
    size_t file = 0;
    int64_t offset = 0;
    Buffer buffer;
    size_t bytes = 0;
  };

  // Queues the staged bytes (they end at in_file_ in the current file).
  absl::Status Flush();
  void Run();  // the writer thread
  absl::Status WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_.empty() || allocated_ < kStagingBuffers || !error_.ok();
  }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || stopping_;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !writing_;
  }

  std::vector<std::unique_ptr<WritableFile>> files_;
  std::vector<std::string> paths_;
  std::vector<int64_t> sizes_;
  const ReceivedBytes seen_;

  // The caller's: the buffer being filled.
  Buffer staging_;
  size_t staged_ = 0;    // bytes in staging_, the current file's
  size_t file_ = 0;      // the file being received
  int64_t in_file_ = 0;  // its bytes taken so far

  mutable Mutex mu_;
  std::deque<Write> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
  int allocated_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_FILE_STREAM_H_
