// CheckpointRoot: a checkpoint root directory without devices or pools —
// what the CLI, Python's inspect and a CheckpointManager share to list,
// read, verify and delete committed steps.
//
// A root opened for writing holds the root's lock (ROOT/.hoist.lock, taken
// through Storage::LockFile, so it applies to every Storage) for its
// lifetime, and has recovered what a crashed process left; one opened for
// reading takes no lock and writes nothing. Every method is thread-safe;
// the Storage must outlive the root.
#ifndef HOIST_CHECKPOINT_ROOT_H_
#define HOIST_CHECKPOINT_ROOT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/checkpoint_types.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// One entry of a root that hoist made: a committed step; a referenced one
// (its manifest pruned, its directory keeps the data files that committed
// steps reference: docs/delta.md; not a checkpoint); or a save that did not
// commit (removed by the next Open for writing).
struct RootEntry {
  enum class Kind { kCommitted, kReferenced, kIncomplete };
  Kind kind = Kind::kCommitted;
  int64_t step = 0;
  std::string path;
};

class CheckpointRoot {
 public:
  // Opens `path` for writing: creates it and its missing parents (each
  // fsynced in its parent, so a step committed under a new root survives a
  // power cut with the root), takes the root's lock and recovers what a
  // crashed process left: a save whose manifest is valid and names its step
  // is committed, a step an overwrite moved aside comes back, and every
  // other temporary entry hoist makes (a link included: removed itself,
  // never followed) is removed; names hoist does not make are left alone.
  // `storage` must outlive the root; without one, the root opens (and owns)
  // OpenStorage(path, options). Errors: kFailedPrecondition when the lock
  // is held (naming the holder) or is not a regular file of this user's;
  // storage errors as is.
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> Open(
      const std::string& path, Storage* storage = nullptr);
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> Open(
      const std::string& path, const StorageOptions& options);

  // Opens the existing root `path` for reading: no lock, no recovery,
  // nothing written; Delete() is kFailedPrecondition. kNotFound if `path`
  // does not exist.
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> OpenForReading(
      const std::string& path, Storage* storage = nullptr);
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> OpenForReading(
      const std::string& path, const StorageOptions& options);

  ~CheckpointRoot();
  CheckpointRoot(const CheckpointRoot&) = delete;
  CheckpointRoot& operator=(const CheckpointRoot&) = delete;

  const std::string& path() const { return path_; }
  Storage& storage() const { return storage_; }
  // What this root's lock file holds ("pid PID on HOST, NONCE"); empty when
  // opened for reading.
  const std::string& lock_token() const { return token_; }
  // For the other processes of a job: kFailedPrecondition unless the lock
  // file holds `token` (rank 0's), which fails when this process does not
  // see the same filesystem as rank 0.
  absl::Status CheckLockHolder(const std::string& token) const;

  // Committed steps, ascending.
  absl::StatusOr<std::vector<int64_t>> List() const;
  // The newest committed step, or nullopt.
  absl::StatusOr<std::optional<int64_t>> Latest() const;
  // Committed steps and incomplete saves, in name order.
  absl::StatusOr<std::vector<RootEntry>> Entries() const;
  // The directory of committed step `step`. kNotFound if there is none;
  // kDataLoss if its name is not a real directory (a link is never read
  // through).
  absl::StatusOr<std::string> StepDir(int64_t step) const;
  // The sizes of the data files in `step`'s directory, a committed or a
  // referenced step's (where deltas left holes in a POSIX file, its size
  // counts them; `du` tells what it occupies). kNotFound if there is no
  // such directory.
  absl::StatusOr<int64_t> HeldBytes(int64_t step) const;
  // `step`'s validated manifest (see ReadManifestFile: kDataLoss when it is
  // corrupt or of another step).
  absl::StatusOr<Manifest> ReadManifest(int64_t step) const;
  // Its head (ManifestHead: each array's name, dtype, shape and what its
  // extents hold, without the extents of a split manifest), read from the
  // manifest's first bytes when it is split. Errors as ReadManifest's.
  absl::StatusOr<ManifestHead> ReadManifestHead(int64_t step) const;
  // Re-reads every extent of `step` against its hash (VerifyReport lists
  // every problem); kNotFound if there is no such step.
  // `progress` (optional) counts the bytes read.
  absl::StatusOr<VerifyReport> Verify(
      int64_t step, OperationProgress* progress = nullptr) const;
  // Reads `targets` of committed step `step` into host memory: every
  // destination has `data` and no device. Only the extents that meet the
  // targets are read, each checked against its hash as it is read (unless
  // options.verify_xxh3 is off). Needs no pool and no lock, so it works on
  // a root opened for reading while a job saves into it.
  // kInvalidArgument for a destination on a device or
  // without memory; otherwise the errors of CheckpointManager::Restore
  // (kNotFound for a step or array the root lacks, kDataLoss for corrupt
  // bytes).
  absl::StatusOr<RestoreStats> Read(int64_t step,
                                    absl::Span<const RestoreTarget> targets,
                                    const RestoreOptions& options = {}) const;

  // Deletes committed step `step`: renames it aside (a crash then leaves a
  // temporary entry that the next Open removes), makes that durable, then
  // removes it, never following a link. When kept steps reference some of
  // its data files (deltas), only its manifest goes (durably, first), and
  // the files nothing references: the step becomes a referenced one
  // (RootEntry::Kind::kReferenced). Either way, referenced steps whose
  // files only it read lose them. kNotFound if there is no such step;
  // kFailedPrecondition for a root opened for reading.
  absl::Status Delete(int64_t step);

 private:
  CheckpointRoot(std::string path, std::unique_ptr<Storage> owned,
                 Storage& storage, std::unique_ptr<FileLock> lock,
                 std::string token);
  // Open and OpenForReading, on `storage` (`owned`, or the caller's).
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> LockAndRecover(
      const std::string& path, std::unique_ptr<Storage> owned,
      Storage& storage);
  static absl::StatusOr<std::unique_ptr<CheckpointRoot>> ForReading(
      const std::string& path, std::unique_ptr<Storage> owned,
      Storage& storage);

  const std::string path_;
  const std::unique_ptr<Storage> owned_storage_;
  Storage& storage_;
  const std::unique_ptr<FileLock> lock_;  // null when opened for reading
  const std::string token_;
};

// ".../ROOT/step_00000007" as (".../ROOT", 7). kInvalidArgument if the last
// component is not a committed step's directory name.
absl::StatusOr<std::pair<std::string, int64_t>> SplitStepDir(
    const std::string& step_dir);

// The root at `path` opened for reading, and a step: `path` is a step
// directory (ROOT/step_N: its root, N) or a root (its newest committed
// step). kNotFound when it is neither.
absl::StatusOr<std::pair<std::unique_ptr<CheckpointRoot>, int64_t>> OpenStepAt(
    const std::string& path, const StorageOptions& options = {});

// The manifest at `path`, read without a lock: a step directory's
// (ROOT/step_N), or, when `path` is a root, its newest committed step's.
// kNotFound when it is neither.
absl::StatusOr<Manifest> ReadManifestAt(const std::string& path,
                                        const StorageOptions& options = {});
// Its head only (CheckpointRoot::ReadManifestHead).
absl::StatusOr<ManifestHead> ReadManifestHeadAt(
    const std::string& path, const StorageOptions& options = {});

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_ROOT_H_
