// Storage: the file-level seam every byte of a checkpoint goes through,
// shaped like LevelDB's Env. Implementations: POSIX (pwrite/pread, O_DIRECT
// for aligned extents), in-memory (with a model of what is durable, for crash
// tests), a fault-injecting wrapper around any of them, and object stores
// (S3, GCS: src/hoist/io/object_store/object_storage.h), which have no rename,
// no real directories, no fsync and no lock.
//
// The commit, how a directory that several processes fill appears to
// readers at once, is the backend's (BeginDir, CommitDir, RemoveCommitted):
// the layer above states what it needs and never asks which backend it has.
// What else differs between backends, callers ask of capabilities(), never
// of the URL: OpenStorage (below) is the one place a URL is parsed.
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
#include <functional>
#include <memory>
#include <string>
#include <string_view>
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
  // Allocates bytes [offset, offset + bytes) of the file on disk (its size
  // becomes at least offset + bytes), so that writing them later cannot
  // run out of room, and direct writes into them need not allocate: ext4
  // takes its inode lock shared for those, and exclusive for a direct write
  // that allocates or extends the file, through the whole write, so writes
  // from several threads to one file wait on each other.
  // kResourceExhausted when the filesystem lacks the room. A filesystem
  // that cannot allocate ahead leaves the file as it was and returns OK, as
  // does the default.
  virtual absl::Status Reserve(int64_t offset, int64_t bytes) {
    (void)offset;
    (void)bytes;
    return absl::OkStatus();
  }
  // True when the file can only be written from its start to its end: every
  // write at the offset where the previous one ended (an object, streamed
  // in parts; the offset is then size()). kInvalidArgument for a write
  // anywhere else. The default: any offset, from any thread.
  virtual bool sequential() const { return false; }
  // Makes every byte written so far durable (for a sequential file: the
  // last write; it takes no more writes).
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

// What a Storage can do, for the callers whose choices depend on it (see
// docs/architecture.md). The default is a local filesystem's.
struct StorageCapabilities {
  // Rename of a file or a directory is atomic, and the default commit
  // publishes a directory by renaming it. Without it (an object store),
  // Rename is kUnimplemented and a directory is committed in place, its
  // marker written last.
  bool atomic_rename = true;
  // A file takes writes at any offset, from several threads at once.
  // Without it every file is written from its start to its end
  // (WritableFile::sequential()), one writer per file.
  bool random_writes = true;
  // Paths name files of this host's filesystem: another tool may open,
  // map (mmap) or read them directly, and a new directory must be made
  // durable in its parent. Without it (an object store) a path is a key,
  // directories are prefixes, and every read is a request to a server: a
  // job does better to read each byte once and pass it between its
  // processes (RestoreOptions::shared_reads' default).
  bool local = true;
  // A List() shows every name written or removed before it began (POSIX;
  // S3 and GCS are strongly consistent for listings since 2020). Without
  // it a caller must not take a missing name for a removed one.
  bool consistent_listing = true;
  // Requests are limited per key prefix (S3: about 3,500 writes and 5,500
  // reads a second per prefix): a step spreads its data objects over
  // hashed prefixes (docs/scale.md).
  bool prefix_rate_limited = false;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // What this storage can do (see StorageCapabilities); the default is a
  // local filesystem's.
  virtual StorageCapabilities capabilities() const { return {}; }

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

  // Creates `path` and whichever of its parents are missing, each made
  // durable in its parent before anything is written into it (so a
  // directory committed under a new root survives a power cut with the
  // root). An object store makes nothing (directories are the names of
  // objects) but checks that the bucket exists: kNotFound naming it.
  virtual absl::Status CreateDirs(const std::string& path);

  // How many data files a process writes at once when its caller leaves
  // the choice to the storage (SavePlanOptions::writer_streams 0 in
  // CheckpointManagerOptions): enough to keep this storage busy, no more
  // than its files' buffers allow in memory. Default 2 (a local disk, whose
  // files take writes at any offset from several threads each).
  virtual int preferred_writer_streams() const { return 2; }

  // The commit, in three moves:
  //   1. BeginDir(dir, tmp, subdirs, marker, replace) returns the
  //      directory to write `dir`'s files into, with `subdirs` in it;
  //   2. the files are written there (by any process);
  //   3. CommitDir(written, dir, marker, bytes, aside) writes the file
  //      `marker` last and makes `dir` appear with every file in it.
  // A directory without its marker is never committed (readers check
  // HasMarker); RemoveCommitted takes one away, marker first in effect.
  //
  // The default is the protocol of a filesystem whose rename is atomic
  // (POSIX, MemoryStorage): BeginDir creates `tmp` (a sibling of `dir`)
  // and its subdirs; CommitDir writes the marker to marker.tmp, syncs it,
  // renames it to `marker`, syncs each subdir and `written`, then renames
  // `written` to `dir` and syncs the parent: from that rename's durability
  // on, `dir` exists with everything in it. An object store writes in
  // place (BeginDir returns `dir`) and commits by writing the marker object,
  // one atomic put (src/hoist/io/object_store/object_storage.h).
  //
  // BeginDir: `replace` allows replacing a committed `dir`: the default
  // keeps it until CommitDir (a crash leaves the old or the new one); an
  // object store, which writes in place, removes it first, marker first (a
  // crash before the commit leaves neither), and removes what an
  // uncommitted earlier attempt left there. kAlreadyExists if `tmp` exists.
  virtual absl::StatusOr<std::string> BeginDir(
      const std::string& dir, const std::string& tmp,
      absl::Span<const std::string> subdirs, const std::string& marker,
      bool replace);
  // CommitDir: `aside` is where a committed `dir` is moved while the new one
  // takes its place (removed once that is durable); empty: kAlreadyExists
  // when `dir` was committed meanwhile. On an error, `dir` is as it was
  // (the old step comes back from `aside`).
  virtual absl::Status CommitDir(const std::string& written,
                                 const std::string& dir,
                                 const std::string& marker,
                                 std::string_view marker_bytes,
                                 const std::string& aside);
  // Whether `dir` holds its marker file `marker`.
  virtual absl::StatusOr<bool> HasMarker(const std::string& dir,
                                         const std::string& marker);
  // Removes committed directory `dir` so that no crash leaves it half
  // there as committed: the default renames it to `aside`, syncs the
  // parent, then removes `aside`; an object store deletes the marker
  // first, then every other object. kNotFound if `dir` does not exist.
  virtual absl::Status RemoveCommitted(const std::string& dir,
                                       const std::string& aside,
                                       const std::string& marker);
};

// A Storage that forwards every call to another (as LevelDB's EnvWrapper):
// the base of a wrapper that changes a few calls (faults, counting, a
// trace) and leaves the rest, the commit and capabilities() included, to
// the storage it wraps. `base` must outlive it and every file opened
// through it.
class StorageWrapper : public Storage {
 public:
  explicit StorageWrapper(Storage& base) : base_(base) {}
  Storage& base() const { return base_; }

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override {
    return base_.LockFile(path, holder);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    return base_.OpenWritable(path);
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    return base_.OpenReadable(path);
  }
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative) override {
    return base_.OpenReadableBeneath(dir, relative);
  }
  absl::Status CreateDir(const std::string& path) override {
    return base_.CreateDir(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_.Rename(from, to);
  }
  absl::Status SyncDir(const std::string& path) override {
    return base_.SyncDir(path);
  }
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override {
    return base_.List(path);
  }
  absl::Status RemoveAll(const std::string& path) override {
    return base_.RemoveAll(path);
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    return base_.Exists(path);
  }
  absl::StatusOr<bool> IsDir(const std::string& path) override {
    return base_.IsDir(path);
  }
  absl::Status CreateDirs(const std::string& path) override {
    return base_.CreateDirs(path);
  }
  int preferred_writer_streams() const override {
    return base_.preferred_writer_streams();
  }
  StorageCapabilities capabilities() const override {
    return base_.capabilities();
  }
  absl::StatusOr<std::string> BeginDir(const std::string& dir,
                                       const std::string& tmp,
                                       absl::Span<const std::string> subdirs,
                                       const std::string& marker,
                                       bool replace) override {
    return base_.BeginDir(dir, tmp, subdirs, marker, replace);
  }
  absl::Status CommitDir(const std::string& written, const std::string& dir,
                         const std::string& marker,
                         std::string_view marker_bytes,
                         const std::string& aside) override {
    return base_.CommitDir(written, dir, marker, marker_bytes, aside);
  }
  absl::StatusOr<bool> HasMarker(const std::string& dir,
                                 const std::string& marker) override {
    return base_.HasMarker(dir, marker);
  }
  absl::Status RemoveCommitted(const std::string& dir, const std::string& aside,
                               const std::string& marker) override {
    return base_.RemoveCommitted(dir, aside, marker);
  }

 private:
  Storage& base_;
};

// The last move of the default commit, for a directory whose files (its
// marker among them) are already durable under `written`: renames it to
// `dir` and syncs the parent (a committed `dir` moved to `aside` first and
// removed once the new one is durable; `aside` empty: kAlreadyExists when
// `dir` exists). On an error, what is visible is as it was. Needs a
// Storage that renames.
absl::Status PublishByRename(Storage& storage, const std::string& written,
                             const std::string& dir, const std::string& aside);

// Object stores: options that override what the environment configures
// (see docs/object-storage.md). Every field's default (empty, or 0) leaves
// the environment's setting, then the client's default. Secrets are never
// written to a log, an error, a trace or a manifest.
struct ObjectStoreOptions {
  // S3: the endpoint URL ("http://127.0.0.1:8333"); default
  // AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then AWS's own.
  std::string endpoint;
  // S3: the region; default AWS_REGION, then AWS_DEFAULT_REGION, then the
  // profile's, then "us-east-1".
  std::string region;
  // S3: keys; default the AWS credential chain (AWS_ACCESS_KEY_ID,
  // AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, then the profile named by
  // AWS_PROFILE in ~/.aws, then the instance's role).
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  // Seconds before one request gives up (default 0: 60 s for a request
  // that moves no byte for that long, a stalled one; 10 s to connect), and
  // attempts per request (default 0: 4), each retry after a growing pause
  // with jitter (200 ms doubling up to 5 s, times a random fraction); a
  // save never hangs on a dead server. S3: the retries of every request
  // of the storage draw on a budget (default 0: 100, refilled at a tenth
  // of it a second), so a store that fails everything fails the save
  // quickly. docs/robustness.md.
  double request_timeout_s = 0;
  double connect_timeout_s = 0;
  int max_attempts = 0;
  int retry_budget = 0;
  // S3: a profile of the shared files (AWS_SHARED_CREDENTIALS_FILE, else
  // ~/.aws/credentials; AWS_CONFIG_FILE, else ~/.aws/config) whose keys and
  // region to use, before the environment's; default AWS_PROFILE, read by
  // the credential chain. Only keys written in the files are read:
  // kInvalidArgument for a profile that has none (one that assumes a role
  // or signs in through SSO: name it in AWS_PROFILE instead).
  std::string profile;
};

// How data files are written and read on a local filesystem: plain
// syscalls (pwritev, preadv, fsync), or io_uring.
enum class IoEngine { kPosix, kIoUring };

// Everything that chooses and configures the Storage of a URL: one value
// that every entry point (the manager, CheckpointRoot, inspect, verify,
// export, import, the CLI and Python) passes to OpenStorage.
struct StorageOptions {
  // A local path's engine.
  IoEngine io = IoEngine::kPosix;
  // An s3:// URL's, and a gs:// URL's, overrides of the environment.
  ObjectStoreOptions s3 = {};
  ObjectStoreOptions gcs = {};
};

// The Storage that holds `url`: an object store for s3://BUCKET[/PREFIX]
// or gs://BUCKET[/PREFIX] (configured by `options`, then the environment),
// else the local filesystem through `options.io`. The only place a URL is
// parsed. kUnimplemented, saying how to build it in, for an object store in
// a build without object storage; kUnavailable, with the reason, for
// io_uring where it does not work; kInvalidArgument for a malformed URL (no
// bucket; another scheme).
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(
    const std::string& url, const StorageOptions& options = {});

// The local filesystem through `options.io` (for a local tier beside a root
// on an object store).
absl::StatusOr<std::unique_ptr<Storage>> OpenLocalStorage(
    const StorageOptions& options = {});

// Deprecated (callers ask Storage::capabilities() instead; removed in the
// next release): true for "s3://..." or "gs://...".
[[deprecated("ask Storage::capabilities()")]] bool IsObjectStoreUrl(
    const std::string& path);

// Deprecated (use OpenStorage; removed in the next release): the Storage
// that holds `root`, an object store configured by `options` or else
// `local()`.
[[deprecated("use OpenStorage")]] absl::StatusOr<std::unique_ptr<Storage>>
OpenStorageFor(
    const std::string& root, const ObjectStoreOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<Storage>>()>& local);

// Whether this build can open s3:// and gs:// roots.
bool ObjectStoresBuiltIn();

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
