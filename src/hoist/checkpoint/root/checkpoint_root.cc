// The device-free side of a checkpoint root: lock, recovery, listing,
// reading, verifying and deleting (see checkpoint_root.h).
#include "hoist/checkpoint_root.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/restore/verify.h"
#include "hoist/checkpoint/save/delta.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/references_file.h"

namespace hoist {
namespace {

// What a crashed process left in `root`, made whole:
//   - a save's directory whose MANIFEST.json is valid and names its step (it
//     crashed after writing the manifest, before or during the rename to
//     step_N) is committed now, as the rename would have: all its data is
//     durable;
//   - a step an overwrite had moved aside (".old") comes back if no step of
//     its number exists;
//   - everything else under a temporary name hoist makes (saves that never
//     wrote a manifest, deletes that were under way, and any link or file
//     someone put under such a name) is removed; a link is removed itself,
//     never followed, never committed;
//   - a step directory without a manifest keeps the data files that
//     committed steps reference (a pruned step whose bytes later steps
//     share: docs/delta.md) and loses the rest, and goes when nothing is
//     left (on an object store, which writes a step in place, a save that
//     never committed); when a committed manifest cannot be read, what it
//     references is unknown, and such directories are left as they are.
// Names hoist does not make are left alone.
absl::Status Recover(Storage& storage, const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(root));
  std::vector<std::string> debris;
  std::vector<std::pair<std::string, int64_t>> aside;
  const auto restore_as_step = [&](const std::string& name,
                                   int64_t step) -> absl::StatusOr<bool> {
    const std::string path = JoinPath(root, name);
    const std::string final_dir = JoinPath(root, StepDirName(step));
    ASSIGN_OR_RETURN(bool exists, storage.Exists(final_dir));
    if (exists || !ReadManifestFile(storage, path).ok()) return false;
    RETURN_IF_ERROR(storage.Rename(path, final_dir));
    RETURN_IF_ERROR(storage.SyncDir(root));
    return true;
  };
  std::vector<int64_t> manifestless;
  for (const std::string& name : names) {
    if (std::optional<int64_t> step = ParseStepDirName(name)) {
      ASSIGN_OR_RETURN(bool committed,
                       storage.HasMarker(JoinPath(root, name),
                                         std::string(kManifestFileName)));
      if (!committed) manifestless.push_back(*step);
      continue;
    }
    const std::optional<TmpStepDir> tmp = ParseTmpStepDirName(name);
    if (!tmp) continue;
    // IsDir does not follow links: a link is debris, whatever it points to.
    ASSIGN_OR_RETURN(bool is_dir, storage.IsDir(JoinPath(root, name)));
    if (is_dir && tmp->kind == TmpKind::kSave) {
      ASSIGN_OR_RETURN(bool committed, restore_as_step(name, tmp->step));
      if (committed) continue;
    }
    if (is_dir && tmp->kind == TmpKind::kAside) {
      aside.emplace_back(name, tmp->step);
    } else {
      debris.push_back(name);
    }
  }
  for (const auto& [name, step] : aside) {
    ASSIGN_OR_RETURN(bool restored, restore_as_step(name, step));
    if (!restored) debris.push_back(name);
  }
  for (const std::string& name : debris) {
    RETURN_IF_ERROR(storage.RemoveAll(JoinPath(root, name)));
  }
  if (!debris.empty()) RETURN_IF_ERROR(storage.SyncDir(root));
  if (manifestless.empty()) return absl::OkStatus();
  absl::StatusOr<absl::flat_hash_set<std::string>> live =
      FilesReadByCommitted(storage, root);
  if (!live.ok()) return absl::OkStatus();  // unknown: keep them all
  return PruneReferenced(storage, root, manifestless, *live);
}

// True when a path of `live` lies in `step`'s directory.
bool HoldsLiveFiles(const absl::flat_hash_set<std::string>& live,
                    int64_t step) {
  const std::string prefix = StepDirName(step) + "/";
  for (const std::string& path : live) {
    if (absl::StartsWith(path, prefix)) return true;
  }
  return false;
}

// "pid PID on HOST, NONCE": who holds a lock, unique to this opening.
std::string LockToken() {
  return absl::StrFormat(
      "pid %d on %s, %016x", getpid(), HostName(),
      std::random_device{}() * uint64_t{0x9e3779b97f4a7c15} ^
          static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
}

}  // namespace

CheckpointRoot::CheckpointRoot(std::string path, std::unique_ptr<Storage> owned,
                               Storage& storage, std::unique_ptr<FileLock> lock,
                               std::string token)
    : path_(std::move(path)),
      owned_storage_(std::move(owned)),
      storage_(storage),
      lock_(std::move(lock)),
      token_(std::move(token)) {}

CheckpointRoot::~CheckpointRoot() = default;

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::Open(
    const std::string& path, Storage* storage) {
  if (storage == nullptr) return Open(path, StorageOptions{});
  return LockAndRecover(path, nullptr, *storage);
}

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::Open(
    const std::string& path, const StorageOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> owned, OpenStorage(path, options));
  Storage& storage = *owned;
  return LockAndRecover(path, std::move(owned), storage);
}

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::OpenForReading(
    const std::string& path, Storage* storage) {
  if (storage == nullptr) return OpenForReading(path, StorageOptions{});
  return ForReading(path, nullptr, *storage);
}

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::OpenForReading(
    const std::string& path, const StorageOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> owned, OpenStorage(path, options));
  Storage& storage = *owned;
  return ForReading(path, std::move(owned), storage);
}

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::LockAndRecover(
    const std::string& path, std::unique_ptr<Storage> owned, Storage& storage) {
  RETURN_IF_ERROR(storage.CreateDirs(path));
  std::string token = LockToken();
  absl::StatusOr<std::unique_ptr<FileLock>> lock =
      storage.LockFile(JoinPath(path, kLockFileName), token);
  if (!lock.ok()) {
    if (!absl::IsFailedPrecondition(lock.status())) return lock.status();
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is in use by another CheckpointManager or hoist command (%s); "
        "two writers must never share one root",
        path, lock.status().message()));
  }
  RETURN_IF_ERROR(Recover(storage, path));
  return std::unique_ptr<CheckpointRoot>(new CheckpointRoot(
      path, std::move(owned), storage, *std::move(lock), std::move(token)));
}

absl::StatusOr<std::unique_ptr<CheckpointRoot>> CheckpointRoot::ForReading(
    const std::string& path, std::unique_ptr<Storage> owned, Storage& storage) {
  ASSIGN_OR_RETURN(bool exists, storage.Exists(path));
  if (!exists) {
    return absl::NotFoundError(absl::StrFormat("%s: no such root", path));
  }
  return std::unique_ptr<CheckpointRoot>(new CheckpointRoot(
      path, std::move(owned), storage, nullptr, std::string()));
}

absl::Status CheckpointRoot::CheckLockHolder(const std::string& token) const {
  const std::string path = JoinPath(path_, kLockFileName);
  std::string held;
  absl::StatusOr<std::unique_ptr<ReadableFile>> file =
      storage_.OpenReadable(path);
  if (file.ok()) {
    absl::StatusOr<int64_t> size = (*file)->Size();
    held.resize(size.ok() ? std::min<int64_t>(*size, 256) : 0);
    if (!(*file)
             ->ReadAt(0, absl::MakeSpan(reinterpret_cast<uint8_t*>(held.data()),
                                        held.size()))
             .ok()) {
      held.clear();
    }
  }
  if (held != token) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s does not hold rank 0's lock ('%s' instead of '%s'): every "
        "process of the job must see the same checkpoint root (a shared "
        "filesystem)",
        path, held, token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RootEntry>> CheckpointRoot::Entries() const {
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage_.List(path_));
  std::vector<RootEntry> entries;
  // What committed steps read, once a directory without a manifest needs it.
  std::optional<absl::StatusOr<absl::flat_hash_set<std::string>>> live;
  for (const std::string& name : names) {
    if (std::optional<int64_t> step = ParseStepDirName(name)) {
      // A step directory without a manifest: data that committed steps
      // reference, or a save still being written in place (an object
      // store), or that never committed.
      ASSIGN_OR_RETURN(bool committed,
                       storage_.HasMarker(JoinPath(path_, name),
                                          std::string(kManifestFileName)));
      if (!committed && !live) {
        live = FilesReadByCommitted(storage_, path_);
      }
      entries.push_back({committed ? RootEntry::Kind::kCommitted
                         : live->ok() && HoldsLiveFiles(**live, *step)
                             ? RootEntry::Kind::kReferenced
                             : RootEntry::Kind::kIncomplete,
                         *step, JoinPath(path_, name)});
    } else if (std::optional<TmpStepDir> tmp = ParseTmpStepDirName(name)) {
      entries.push_back(
          {RootEntry::Kind::kIncomplete, tmp->step, JoinPath(path_, name)});
    }
  }
  return entries;
}

// Not through Entries(): telling a referenced step from an incomplete one
// reads every manifest, and the manager lists the root at every save.
absl::StatusOr<std::vector<int64_t>> CheckpointRoot::List() const {
  return CommittedSteps(storage_, path_);
}

absl::StatusOr<std::optional<int64_t>> CheckpointRoot::Latest() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}

absl::StatusOr<std::string> CheckpointRoot::StepDir(int64_t step) const {
  const std::string dir = JoinPath(path_, StepDirName(step));
  ASSIGN_OR_RETURN(bool exists, storage_.Exists(dir));
  if (!exists) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no committed step %d", path_, step));
  }
  ASSIGN_OR_RETURN(bool is_dir, storage_.IsDir(dir));
  if (!is_dir) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a directory (a link or a file); hoist does not follow "
        "links out of a root",
        dir));
  }
  ASSIGN_OR_RETURN(bool committed,
                   storage_.HasMarker(dir, std::string(kManifestFileName)));
  if (!committed) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: step %d has no manifest: it never committed (or is being "
        "written)",
        path_, step));
  }
  return dir;
}

absl::StatusOr<int64_t> CheckpointRoot::HeldBytes(int64_t step) const {
  const std::string dir = JoinPath(path_, StepDirName(step));
  ASSIGN_OR_RETURN(bool is_dir, storage_.IsDir(dir));
  if (!is_dir) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no step directory %d", path_, step));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names,
                   ListDataFiles(storage_, dir));
  int64_t bytes = 0;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                     storage_.OpenReadableBeneath(dir, name));
    ASSIGN_OR_RETURN(int64_t size, file->Size());
    bytes += size;
  }
  return bytes;
}

absl::StatusOr<Manifest> CheckpointRoot::ReadManifest(int64_t step) const {
  ASSIGN_OR_RETURN(const std::string dir, StepDir(step));
  return ReadManifestFile(storage_, dir);
}

absl::StatusOr<ManifestHead> CheckpointRoot::ReadManifestHead(
    int64_t step) const {
  ASSIGN_OR_RETURN(const std::string dir, StepDir(step));
  return hoist::ReadManifestHead(storage_, dir);
}

absl::StatusOr<VerifyReport> CheckpointRoot::Verify(
    int64_t step, OperationProgress* progress) const {
  ASSIGN_OR_RETURN(const std::string dir, StepDir(step));
  return VerifyCheckpoint(storage_, dir, progress);
}

absl::StatusOr<RestoreStats> CheckpointRoot::Read(
    int64_t step, absl::Span<const RestoreTarget> targets,
    const RestoreOptions& options) const {
  for (const RestoreTarget& target : targets) {
    for (const RestoreDestination& dest : target.destinations) {
      if (dest.device != nullptr || dest.data == nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "reading '%s' from %s: a destination is not host memory (a "
            "restore onto devices goes through a CheckpointManager)",
            target.name, path_));
      }
    }
  }
  ASSIGN_OR_RETURN(const std::string dir, StepDir(step));
  // Host destinations never stage through a pool: this one stays empty.
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   StagingPool::CreatePending(StagingPool::kAlignment));
  return RestoreCheckpoint(storage_, dir, targets, *pool, options);
}

absl::Status CheckpointRoot::Delete(int64_t step) {
  if (lock_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s was opened for reading: deleting needs the root's lock", path_));
  }
  const std::string dir = JoinPath(path_, StepDirName(step));
  ASSIGN_OR_RETURN(bool exists, storage_.Exists(dir));
  if (!exists) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no committed step %d", path_, step));
  }
  ASSIGN_OR_RETURN(bool committed,
                   storage_.HasMarker(dir, std::string(kManifestFileName)));
  if (!committed) {
    return absl::NotFoundError(
        absl::StrFormat("%s: no committed step %d", path_, step));
  }
  // The steps whose data this step reads: they may hold nothing kept
  // steps read once it is gone.
  std::vector<int64_t> read = {step};
  if (absl::StatusOr<std::vector<std::string>> files =
          FilesReadByStep(storage_, path_, step);
      files.ok()) {
    for (const std::string& file : *files) {
      const std::optional<int64_t> other = StepOfReferencedFile(file);
      if (other && std::find(read.begin(), read.end(), *other) == read.end()) {
        read.push_back(*other);
      }
    }
  }
  // Kept steps' references to this one's files keep them (and only them)
  // in place; a manifest that cannot be read could reference any: then
  // every file stays.
  absl::StatusOr<absl::flat_hash_set<std::string>> live =
      FilesReadByCommitted(storage_, path_, step);
  if (live.ok() && !HoldsLiveFiles(*live, step)) {
    const std::string aside =
        JoinPath(path_, absl::StrCat(TmpStepDirName(step), kDeletingSuffix));
    RETURN_IF_ERROR(
        storage_.RemoveCommitted(dir, aside, std::string(kManifestFileName)));
    read.erase(read.begin());
    return PruneReferenced(storage_, path_, read, *live);
  }
  // The manifest goes first (durably): from then on the directory is no
  // checkpoint, only data that kept steps read.
  RETURN_IF_ERROR(
      storage_.RemoveAll(JoinPath(dir, std::string(kManifestFileName))));
  RETURN_IF_ERROR(storage_.SyncDir(dir));
  if (!live.ok()) return absl::OkStatus();
  return PruneReferenced(storage_, path_, read, *live);
}

absl::StatusOr<std::pair<std::string, int64_t>> SplitStepDir(
    const std::string& step_dir) {
  std::string path = step_dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  const std::string name =
      slash == std::string::npos ? path : path.substr(slash + 1);
  const std::optional<int64_t> step = ParseStepDirName(name);
  if (!step) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not a step directory (ROOT/step_NNNNNNNN)", step_dir));
  }
  return std::make_pair(ParentDir(path), *step);
}

absl::StatusOr<std::pair<std::unique_ptr<CheckpointRoot>, int64_t>> OpenStepAt(
    const std::string& path, const StorageOptions& options) {
  absl::StatusOr<std::pair<std::string, int64_t>> split = SplitStepDir(path);
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRoot> root,
                   CheckpointRoot::OpenForReading(
                       split.ok() ? split->first : path, options));
  if (split.ok()) return std::make_pair(std::move(root), split->second);
  ASSIGN_OR_RETURN(std::optional<int64_t> latest, root->Latest());
  if (!latest) {
    // A step copied elsewhere (renamed, or alone in a directory) holds a
    // manifest, but no root above it: say so rather than "no step".
    absl::StatusOr<bool> manifest =
        root->storage().HasMarker(path, std::string(kManifestFileName));
    if (manifest.ok() && *manifest) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s holds a %s but is not a step directory inside a root (a "
          "step_N directory beside its root's other steps): a step copied "
          "elsewhere; copy it back as ROOT/step_N (with every step it "
          "references) and give that path",
          path, kManifestFileName));
    }
    return absl::NotFoundError(absl::StrFormat(
        "%s: neither a step directory nor a root with a committed step", path));
  }
  return std::make_pair(std::move(root), *latest);
}

absl::StatusOr<Manifest> ReadManifestAt(const std::string& path,
                                        const StorageOptions& options) {
  ASSIGN_OR_RETURN(auto opened, OpenStepAt(path, options));
  return opened.first->ReadManifest(opened.second);
}

absl::StatusOr<ManifestHead> ReadManifestHeadAt(const std::string& path,
                                                const StorageOptions& options) {
  ASSIGN_OR_RETURN(auto opened, OpenStepAt(path, options));
  return opened.first->ReadManifestHead(opened.second);
}

}  // namespace hoist
