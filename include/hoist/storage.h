// Storage: the file-level seam every byte of a checkpoint goes through,
// shaped like LevelDB's Env. Implementations: POSIX (pwrite/pread, O_DIRECT
// for aligned extents), in-memory (with a model of what is durable, for crash
// tests), and a fault-injecting wrapper around any of them.
//
// Paths are '/'-separated strings. Durability follows POSIX: a file's bytes
// are durable after its Sync(); a file's (or directory's) name is durable
// after SyncDir() of the directory holding it. Errors: kNotFound,
// kAlreadyExists, kResourceExhausted (disk full), kPermissionDenied,
// kDataLoss (a read past the end of a file: truncated), kAborted (an I/O
// error; retry the checkpoint), kInvalidArgument. Messages name the path.
// All methods are thread-safe; one file may be written at disjoint offsets
// from several threads at once.
#ifndef HOIST_STORAGE_H_
#define HOIST_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hoist {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes `data` at `offset`, extending the file if needed. A write whose
  // offset, length and buffer are 4 KiB-aligned may bypass the page cache
  // (O_DIRECT); any other goes through it.
  virtual absl::Status WriteAt(int64_t offset,
                               absl::Span<const uint8_t> data) = 0;
  // Writes `pieces` back to back from `offset`, as one write where the
  // implementation can (pwritev). The default writes them one by one.
  virtual absl::Status WriteAtv(
      int64_t offset, absl::Span<const absl::Span<const uint8_t>> pieces) {
    for (absl::Span<const uint8_t> piece : pieces) {
      if (absl::Status s = WriteAt(offset, piece); !s.ok()) return s;
      offset += static_cast<int64_t>(piece.size());
    }
    return absl::OkStatus();
  }
  // Allocates the file's first `bytes` bytes on disk (its size becomes at
  // least `bytes`), so that writing them later cannot run out of room, and
  // direct writes into them need not allocate (ext4 lets such writes run
  // in parallel; it serializes those that allocate). kResourceExhausted
  // when the filesystem lacks the room. A filesystem that cannot allocate
  // ahead leaves the file as it was and returns OK, as does the default.
  virtual absl::Status Reserve(int64_t bytes) {
    (void)bytes;
    return absl::OkStatus();
  }
  // Makes every byte written so far durable.
  virtual absl::Status Sync() = 0;
  // Releases the file; further calls fail. Does not sync.
  virtual absl::Status Close() = 0;
};

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // Fills `out` from `offset`. kDataLoss if the file ends first.
  virtual absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) = 0;
  virtual absl::StatusOr<int64_t> Size() = 0;
};

// An exclusive lock on a file, held until this object is destroyed (as
// LevelDB's Env::LockFile). Destroy it before the Storage that made it.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // Takes an exclusive lock on `path`, creating it (mode 0600) if needed,
  // and writes `holder` into it (who holds it: the next caller refused is
  // told, and other processes can read it back to check that they see this
  // lock). kFailedPrecondition naming the holder if the lock is held, by
  // another process or by this one; kFailedPrecondition too, writing
  // nothing, if `path` is a link, not a regular file, has more than one
  // name, or belongs to another user.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) = 0;

  // Creates `path` for writing. kAlreadyExists if anything exists there
  // (a file, a link, a FIFO): hoist writes only files it has just created,
  // never through a link.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) = 0;
  // Opens the regular file `path` for reading. kDataLoss, without blocking,
  // if it is a link (never followed) or not a regular file (a FIFO, socket,
  // device or directory); kNotFound if it does not exist.
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) = 0;
  // Opens `relative` (a plain relative path, see IsSafeRelativePath) under
  // the directory `dir` as OpenReadable does, following no link on the way:
  // kDataLoss "not a directory inside" if a directory between them is a link
  // or missing. The default checks each directory with IsDir, then opens;
  // the POSIX storage walks down with openat(O_NOFOLLOW), so nothing can
  // swap a directory for a link in between.
  virtual absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative);
  // Creates one directory; its parent must exist. kAlreadyExists if it does.
  virtual absl::Status CreateDir(const std::string& path) = 0;
  // Atomically renames a file or directory. kAlreadyExists if `to` exists.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  // Makes the names in directory `path` durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  // Names (not paths) in directory `path`, sorted.
  virtual absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) = 0;
  // Removes a file or a directory tree. OK if `path` does not exist. Never
  // follows a link: a link is removed itself, and a tree is removed entry by
  // entry relative to its open directories (nothing outside it can be
  // reached by renaming a directory mid-removal).
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  virtual absl::StatusOr<bool> Exists(const std::string& path) = 0;
  // True if `path` is a directory.
  virtual absl::StatusOr<bool> IsDir(const std::string& path) = 0;
};

// The local filesystem, through plain syscalls (pwritev, preadv, fsync).
std::unique_ptr<Storage> MakePosixStorage();

// The local filesystem, every transfer and fsync submitted to io_uring (rings
// lent from a pool, one per concurrent call). kUnavailable with the reason
// where io_uring is not available (old kernel, seccomp, or a build without
// liburing).
absl::StatusOr<std::unique_ptr<Storage>> MakeIoUringStorage();

// Joins path components with '/'.
std::string JoinPath(const std::string& a, const std::string& b);

}  // namespace hoist

#endif  // HOIST_STORAGE_H_
