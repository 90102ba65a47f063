// FaultInjectingStorage: forwards to another Storage and injects the
// failures a checkpoint must survive: the Nth write, sync or reservation
// (fallocate) failing with an errno (EIO, ENOSPC), a torn write (the first half
// lands, then the error), a crash at the Nth sync (that sync does not happen,
// and every later call fails with kAborted, as if the process had died), and
// storage that is stuck (Stall: every write and sync waits until Resume, as a
// hung NFS or Lustre target does; StallReads: every read of a file's bytes).
// Pair it with MemoryStorage::Crash() to drop what was not durable at the
// crash.
#ifndef HOIST_IO_FAULT_STORAGE_H_
#define HOIST_IO_FAULT_STORAGE_H_

#include <atomic>
#include <string>
#include <utility>

#include "hoist/mutex.h"
#include "hoist/storage.h"

namespace hoist {

struct FaultPlan {
  int fail_write = -1;     // 0-based index of the WriteAt to fail; -1 never
  int fail_sync = -1;      // of the Sync or SyncDir to fail
  int fail_reserve = -1;   // of the Reserve to fail
  int error = 5;           // errno of the failure (EIO)
  bool torn = false;       // the failing write writes its first half first
  int crash_at_sync = -1;  // the Sync or SyncDir at which the process "dies"
};

class FaultInjectingStorage final : public StorageWrapper {
 public:
  // `base` must outlive this and every file opened through it.
  FaultInjectingStorage(Storage& base, FaultPlan plan)
      : StorageWrapper(base), plan_(plan) {}

  // From now on every write and sync waits (stuck storage) until Resume().
  void Stall() {
    MutexLock lock(&stall_mu_);
    stalled_ = true;
  }
  // From now on every read of the bytes of an opened file whose path has
  // `matching` in it (default: any) waits until Resume().
  void StallReads(std::string matching = "") {
    MutexLock lock(&stall_mu_);
    reads_stalled_ = true;
    stalled_reads_matching_ = std::move(matching);
  }
  void Resume() {
    MutexLock lock(&stall_mu_);
    stalled_ = false;
    reads_stalled_ = false;
  }
  // Writes, syncs and reads waiting in a stall now.
  int stalled_calls() const {
    MutexLock lock(&stall_mu_);
    return waiting_;
  }

  int writes() const { return writes_.load(); }
  int syncs() const { return syncs_.load(); }
  int reserves() const { return reserves_.load(); }
  bool crashed() const { return crashed_.load(); }

  // Each call checks for a crash (and a stall or fault on cue), then
  // forwards.
  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative) override;
  absl::Status CreateDir(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<bool> IsDir(const std::string& path) override;
  absl::Status CreateDirs(const std::string& path) override;

  // Over a storage whose rename is atomic, the commit runs Storage's own
  // protocol through this wrapper's primitives, so that a fault on cue
  // lands inside it (a sync of the marker, the publishing rename); over
  // any other (an object store), the base's.
  absl::StatusOr<std::string> BeginDir(const std::string& dir,
                                       const std::string& tmp,
                                       absl::Span<const std::string> subdirs,
                                       const std::string& marker,
                                       bool replace) override;
  absl::Status CommitDir(const std::string& written, const std::string& dir,
                         const std::string& marker,
                         std::string_view marker_bytes,
                         const std::string& aside) override;
  absl::StatusOr<bool> HasMarker(const std::string& dir,
                                 const std::string& marker) override;
  absl::Status RemoveCommitted(const std::string& dir, const std::string& aside,
                               const std::string& marker) override;

  // Used by the file wrappers.
  absl::Status BeforeWrite(const std::string& path, bool* torn);
  absl::Status BeforeSync(const std::string& path);
  absl::Status BeforeReserve(const std::string& path);
  absl::Status CheckAlive(const std::string& path) const;
  absl::Status BeforeRead(const std::string& path);

 private:
  void WaitWhileStalled();
  bool NotStalled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stall_mu_) {
    return !stalled_;
  }
  bool ReadsNotStalled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(stall_mu_) {
    return !reads_stalled_;
  }

  // Whether the commit runs through this wrapper (see BeginDir).
  bool OwnCommit() const { return base().capabilities().atomic_rename; }

  const FaultPlan plan_;
  std::atomic<int> writes_{0};
  std::atomic<int> syncs_{0};
  std::atomic<int> reserves_{0};
  std::atomic<bool> crashed_{false};
  mutable Mutex stall_mu_;
  bool stalled_ ABSL_GUARDED_BY(stall_mu_) = false;
  bool reads_stalled_ ABSL_GUARDED_BY(stall_mu_) = false;
  std::string stalled_reads_matching_ ABSL_GUARDED_BY(stall_mu_);
  int waiting_ ABSL_GUARDED_BY(stall_mu_) = 0;
};

}  // namespace hoist

#endif  // HOIST_IO_FAULT_STORAGE_H_
