// The checkpoint manager. Save() plans on the caller's thread (reusing the
// last plan when the arrays' specs have not changed, as in a training loop,
// so planning stays off the time training is blocked) and queues a
// job; the saver thread runs jobs in order (stage, persist, commit: see
// save.cc), reporting each stage through the job's promises, then applies
// retention. A job's error that Save() did not already return is kept and
// returned by the next call, so no background error is ever lost.
#include "hoist/checkpoint_manager.h"

#include <algorithm>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/layout.h"
#include "hoist/checkpoint/restore.h"
#include "hoist/checkpoint/root_lock.h"
#include "hoist/checkpoint/save.h"
#include "hoist/checkpoint/verify.h"
#include "hoist/mutex.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

absl::Status SaveHandle::status() const {
  if (!committed_.ready()) {
    return absl::UnavailableError(
        absl::StrFormat("step %d is still being saved", step_));
  }
  return committed_.Wait().status();
}

namespace {

struct Job {
  int64_t step = 0;
  std::vector<ArraySpec> specs;
  std::shared_ptr<const SavePlan> plan;  // shared with later saves
  ShardSources sources;
  std::string metadata_json;
  absl::Time start;
  Promise<> dispatched;
  Promise<> staged;
  Promise<SaveInfo> committed;
  std::shared_ptr<SaveProgress> progress = std::make_shared<SaveProgress>();
  absl::Duration dispatched_after, staged_after;
  // Set by Save() once it has returned, and whether it returned an error.
  Notification save_returned;
  bool error_returned = false;
};

absl::StatusOr<Topology> GatherTopology(Backend& backend,
                                        Coordinator& coordinator) {
  std::string mine;
  for (Device* device : backend.devices()) {
    const DeviceId id = device->id();
    mine.append(reinterpret_cast<const char*>(&id), sizeof id);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   coordinator.AllGather("devices", mine));
  std::vector<std::vector<DeviceId>> process_devices(all.size());
  for (size_t p = 0; p < all.size(); ++p) {
    for (size_t at = 0; at + sizeof(DeviceId) <= all[p].size();
         at += sizeof(DeviceId)) {
      DeviceId id;
      std::memcpy(&id, all[p].data() + at, sizeof id);
      process_devices[p].push_back(id);
    }
  }
  return Topology::Create(std::move(process_devices));
}

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
//     never followed, never committed. Names hoist does not make are left
//     alone.
absl::Status Recover(Storage& storage, const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, storage.List(root));
  std::vector<std::string> debris;
  std::vector<std::pair<std::string, int64_t>> aside;
  const auto restore_as_step = [&](const std::string& name,
                                   int64_t step) -> absl::StatusOr<bool> {
    const std::string path = JoinPath(root, name);
    const std::string final_dir = JoinPath(root, StepDirName(step));
    ASSIGN_OR_RETURN(bool exists, storage.Exists(final_dir));
    if (exists || !ReadManifest(storage, path).ok()) return false;
    RETURN_IF_ERROR(storage.Rename(path, final_dir));
    RETURN_IF_ERROR(storage.SyncDir(root));
    return true;
  };
  for (const std::string& name : names) {
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
  return absl::OkStatus();
}

// Creates `root` and whichever of its parents are missing, each made durable
// in its parent (SyncDir) before anything is written into it, so a step
// committed under a new root survives a power cut with the root.
absl::Status CreateRoot(Storage& storage, const std::string& root) {
  std::vector<std::string> missing;
  std::string path = root;
  while (!path.empty() && path != "/") {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    ASSIGN_OR_RETURN(bool exists, storage.Exists(path));
    if (exists) break;
    missing.push_back(path);
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos
               ? ""
               : path.substr(0, std::max<size_t>(slash, 1));
  }
  for (size_t i = missing.size(); i-- > 0;) {
    absl::Status created = storage.CreateDir(missing[i]);
    if (!created.ok() && !absl::IsAlreadyExists(created)) return created;
    const size_t slash = missing[i].rfind('/');
    RETURN_IF_ERROR(storage.SyncDir(
        slash == std::string::npos
            ? "."
            : missing[i].substr(0, std::max<size_t>(slash, 1))));
  }
  return absl::OkStatus();
}

}  // namespace

class CheckpointManager::Impl {
 public:
  Impl(std::string root, Backend& backend, Coordinator& coordinator,
       CheckpointManagerOptions options, std::unique_ptr<Storage> owned,
       Storage& storage, Topology topology, std::unique_ptr<StagingPool> pool,
       std::unique_ptr<RootLock> lock)
      : root_(std::move(root)),
        backend_(backend),
        coordinator_(coordinator),
        options_(std::move(options)),
        owned_storage_(std::move(owned)),
        storage_(storage),
        topology_(std::move(topology)),
        pool_(std::move(pool)),
        engine_(*pool_, TransferOptions{.tracer = options_.tracer}),
        lock_(std::move(lock)) {
    saver_ = std::thread([this] { SaverLoop(); });
  }

  ~Impl() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    saver_.join();
  }

  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  absl::Span<const SaveArray> arrays,
                                  std::string metadata_json,
                                  ReturnWhen return_when) {
    RETURN_IF_ERROR(TakeDeferredError());
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d is negative", step));
    }
    // Refused here, before the step is accepted: the saver thread must never
    // meet metadata a manifest cannot carry.
    RETURN_IF_ERROR(ValidateMetadataJson(metadata_json));
    auto job = std::make_shared<Job>();
    job->step = step;
    job->metadata_json = std::move(metadata_json);
    absl::flat_hash_set<DeviceId> local;
    for (Device* device : backend_.devices()) local.insert(device->id());
    for (size_t a = 0; a < arrays.size(); ++a) {
      job->specs.push_back(arrays[a].spec);
      for (const SaveArray::Shard& shard : arrays[a].shards) {
        if (!local.contains(shard.device) || shard.data == nullptr) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "array '%s': shard on device %d is not on this process's "
              "devices or has no data",
              arrays[a].spec.name, shard.device));
        }
        job->sources.Add(static_cast<int>(a), shard.device, shard.data);
      }
    }
    ASSIGN_OR_RETURN(job->plan, PlanFor(job->specs));
    // Wait for room, then refuse a step that exists or is being saved.
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &Impl::HasRoom));
      if (in_flight_steps_.contains(step)) {
        return absl::AlreadyExistsError(
            absl::StrFormat("step %d is already being saved", step));
      }
    }
    ASSIGN_OR_RETURN(bool exists,
                     storage_.Exists(JoinPath(root_, StepDirName(step))));
    if (exists) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s: step %d is already committed", root_, step));
    }
    for (int s : job->plan->SlicesOfProcess(coordinator_.rank())) {
      job->progress->total_bytes += job->plan->slices[s].length_bytes;
    }
    SaveHandle handle(step, job->dispatched.future(), job->staged.future(),
                      job->committed.future(), job->progress);
    job->start = absl::Now();
    job->progress->start = job->start;
    {
      MutexLock lock(&mu_);
      in_flight_steps_.insert(step);
      queue_.push_back(job);
    }
    const absl::Status status = return_when == ReturnWhen::kStaged
                                    ? handle.WaitStaged()
                                    : handle.WaitDispatched();
    job->error_returned = !status.ok();
    job->save_returned.Notify();
    if (!status.ok()) return status;
    return handle;
  }

  absl::Status WaitUntilFinished() {
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &Impl::Idle));
    }
    return TakeDeferredError();
  }

  absl::StatusOr<std::vector<int64_t>> List() const {
    ASSIGN_OR_RETURN(std::vector<std::string> names, storage_.List(root_));
    std::vector<int64_t> steps;
    for (const std::string& name : names) {
      if (std::optional<int64_t> step = ParseStepDirName(name)) {
        steps.push_back(*step);
      }
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  absl::StatusOr<RestoreStats> Restore(
      std::optional<int64_t> step, absl::Span<const RestoreTarget> targets) {
    RETURN_IF_ERROR(TakeDeferredError());
    if (!step) {
      ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
      if (steps.empty()) {
        return absl::NotFoundError(
            absl::StrFormat("%s holds no committed step", root_));
      }
      step = steps.back();
    }
    ASSIGN_OR_RETURN(const std::string dir, StepDirToRead(*step));
    return RestoreCheckpoint(storage_, dir, targets, *pool_, options_.restore);
  }

  absl::StatusOr<VerifyReport> Verify(int64_t step) const {
    ASSIGN_OR_RETURN(const std::string dir, StepDirToRead(step));
    return VerifyCheckpoint(storage_, dir);
  }

  absl::Status Delete(int64_t step) {
    {
      MutexLock lock(&mu_);
      if (in_flight_steps_.contains(step)) {
        return absl::FailedPreconditionError(
            absl::StrFormat("step %d is being saved", step));
      }
    }
    const std::string dir = JoinPath(root_, StepDirName(step));
    ASSIGN_OR_RETURN(bool exists, storage_.Exists(dir));
    if (!exists) {
      return absl::NotFoundError(
          absl::StrFormat("%s: no committed step %d", root_, step));
    }
    return RemoveStep(step);
  }

  const std::string& root() const { return root_; }

 private:
  // The directory of committed step `step`: kNotFound if there is none,
  // kDataLoss if its name is not a real directory (a link is never read
  // through).
  absl::StatusOr<std::string> StepDirToRead(int64_t step) const {
    const std::string dir = JoinPath(root_, StepDirName(step));
    ASSIGN_OR_RETURN(bool exists, storage_.Exists(dir));
    if (!exists) {
      return absl::NotFoundError(
          absl::StrFormat("%s: no committed step %d", root_, step));
    }
    ASSIGN_OR_RETURN(bool is_dir, storage_.IsDir(dir));
    if (!is_dir) {
      return absl::DataLossError(absl::StrFormat(
          "%s: not a directory (a link or a file); hoist does not follow "
          "links out of a root",
          dir));
    }
    return dir;
  }

  // The plan of `specs`: the previous save's if the specs are the same.
  absl::StatusOr<std::shared_ptr<const SavePlan>> PlanFor(
      const std::vector<ArraySpec>& specs) ABSL_LOCKS_EXCLUDED(plan_mu_) {
    MutexLock lock(&plan_mu_);
    if (planned_plan_ == nullptr || planned_specs_ != specs) {
      ASSIGN_OR_RETURN(SavePlan plan,
                       MakeSavePlan(specs, topology_, options_.plan));
      planned_plan_ = std::make_shared<const SavePlan>(std::move(plan));
      planned_specs_ = specs;
    }
    return planned_plan_;
  }

  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(in_flight_steps_.size()) <
           std::max(1, options_.max_in_flight);
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_steps_.empty();
  }
  bool HasJobOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Status TakeDeferredError() {
    MutexLock lock(&mu_);
    return std::exchange(deferred_error_, absl::OkStatus());
  }

  // Uncommits nothing: renames the step aside first (a crash then leaves a
  // tmp-looking directory that garbage collection removes), then removes it.
  absl::Status RemoveStep(int64_t step) {
    const std::string dir = JoinPath(root_, StepDirName(step));
    const std::string aside =
        JoinPath(root_, absl::StrCat(TmpStepDirName(step), kDeletingSuffix));
    RETURN_IF_ERROR(storage_.Rename(dir, aside));
    RETURN_IF_ERROR(storage_.SyncDir(root_));
    return storage_.RemoveAll(aside);
  }

  // Deletes committed steps beyond keep_last (sparing multiples of
  // keep_every), never `newest` (just committed) or a step in flight.
  absl::Status ApplyRetention(int64_t newest) {
    if (options_.keep_last <= 0 || coordinator_.rank() != 0) {
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
    const int keep = options_.keep_last;
    for (size_t i = 0; i + keep < steps.size(); ++i) {
      const int64_t step = steps[i];
      if (step == newest) continue;
      if (options_.keep_every > 0 && step % options_.keep_every == 0) continue;
      {
        MutexLock lock(&mu_);
        if (in_flight_steps_.contains(step)) continue;
      }
      RETURN_IF_ERROR(RemoveStep(step));
    }
    return absl::OkStatus();
  }

  void SaverLoop() {
    while (true) {
      std::shared_ptr<Job> job;
      {
        MutexLock lock(&mu_);
        mu_.Await(Condition(this, &Impl::HasJobOrStopping));
        if (queue_.empty()) return;
        job = queue_.front();
        queue_.pop_front();
      }
      absl::StatusOr<SaveInfo> info = Run(*job);
      if (info.ok()) {
        absl::Status retained = ApplyRetention(job->step);
        if (!retained.ok()) {
          MutexLock lock(&mu_);
          if (deferred_error_.ok()) deferred_error_ = retained;
        }
      }
      // An error Save() already returned is not reported twice.
      job->save_returned.WaitForNotification();
      {
        MutexLock lock(&mu_);
        if (!info.ok() && !job->error_returned && deferred_error_.ok()) {
          deferred_error_ = info.status();
        }
        in_flight_steps_.erase(job->step);
      }
      job->committed.Set(std::move(info));
    }
  }

  absl::StatusOr<SaveInfo> Run(Job& job) {
    SaveRequest request;
    request.root = root_;
    request.step = job.step;
    request.arrays = job.specs;
    request.plan = job.plan.get();
    request.metadata_json = job.metadata_json;
    request.tracer = options_.tracer;
    request.progress = job.progress.get();
    request.on_dispatched = [&job](const absl::Status& status) {
      job.dispatched_after = absl::Now() - job.start;
      job.dispatched.Set(status);
    };
    request.on_staged = [&job](const absl::Status& status) {
      job.staged_after = absl::Now() - job.start;
      job.staged.Set(status);
    };
    absl::StatusOr<SaveResult> result =
        SaveCheckpoint(storage_, coordinator_, request, engine_,
                       backend_.devices(), job.sources);
    if (!result.ok()) return result.status();
    SaveInfo info;
    info.step = job.step;
    info.path = result->path;
    info.bytes = result->bytes;
    info.dispatches = result->transfer.dispatches;
    info.waves = result->transfer.waves;
    info.dispatched = job.dispatched_after;
    info.staged = job.staged_after;
    info.committed = absl::Now() - job.start;
    return info;
  }

  const std::string root_;
  Backend& backend_;
  Coordinator& coordinator_;
  const CheckpointManagerOptions options_;
  const std::unique_ptr<Storage> owned_storage_;
  Storage& storage_;
  const Topology topology_;
  const std::unique_ptr<StagingPool> pool_;
  TransferEngine engine_;  // used by the saver thread only
  const std::unique_ptr<RootLock> lock_;

  Mutex plan_mu_;
  std::vector<ArraySpec> planned_specs_ ABSL_GUARDED_BY(plan_mu_);
  std::shared_ptr<const SavePlan> planned_plan_ ABSL_GUARDED_BY(plan_mu_);

  Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> in_flight_steps_ ABSL_GUARDED_BY(mu_);
  absl::Status deferred_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread saver_;  // last: started once everything above exists
};

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    const std::string& root, Backend& backend, Coordinator& coordinator,
    const CheckpointManagerOptions& options, Storage* storage) {
  if (options.pool_bytes <= 0 || options.keep_last < 0 ||
      options.keep_every < 0 || options.max_in_flight < 1) {
    return absl::InvalidArgumentError(
        "checkpoint manager options: pool_bytes and max_in_flight must be "
        "positive, keep_last and keep_every non-negative");
  }
  std::unique_ptr<Storage> owned;
  if (storage == nullptr) {
    if (options.io == IoEngine::kIoUring) {
      ASSIGN_OR_RETURN(owned, MakeIoUringStorage());
    } else {
      owned = MakePosixStorage();
    }
    storage = owned.get();
  }
  RETURN_IF_ERROR(CreateRoot(*storage, root));
  // One lock per job: rank 0 takes it and recovers the root, then tells the
  // others, who check that they see its lock (the same filesystem).
  std::unique_ptr<RootLock> lock;
  absl::Status opened;
  if (coordinator.rank() == 0) {
    if (owned != nullptr) {
      absl::StatusOr<std::unique_ptr<RootLock>> acquired =
          RootLock::Acquire(root);
      opened = acquired.status();
      if (acquired.ok()) lock = *std::move(acquired);
    }
    if (opened.ok()) opened = Recover(*storage, root);
  }
  ASSIGN_OR_RETURN(
      std::string token,
      coordinator.Broadcast("open",
                            opened.ok() ? (lock ? lock->token() : "-")
                                        : absl::StrCat("!", opened.message()),
                            0));
  RETURN_IF_ERROR(opened);
  if (absl::StartsWith(token, "!")) {
    return absl::FailedPreconditionError(
        absl::StrFormat("rank 0 could not open %s: %s", root, token.substr(1)));
  }
  if (coordinator.rank() != 0 && owned != nullptr && token != "-") {
    RETURN_IF_ERROR(RootLock::Check(root, token));
  }
  ASSIGN_OR_RETURN(Topology topology, GatherTopology(backend, coordinator));
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   StagingPool::Create(backend, options.pool_bytes));
  Storage& storage_ref = *storage;
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::make_unique<Impl>(
          root, backend, coordinator, options, std::move(owned), storage_ref,
          std::move(topology), std::move(pool), std::move(lock))));
}

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CheckpointManager::~CheckpointManager() = default;

absl::StatusOr<SaveHandle> CheckpointManager::Save(
    int64_t step, absl::Span<const SaveArray> arrays, std::string metadata_json,
    ReturnWhen return_when) {
  return impl_->Save(step, arrays, std::move(metadata_json), return_when);
}
absl::Status CheckpointManager::WaitUntilFinished() {
  return impl_->WaitUntilFinished();
}
absl::StatusOr<RestoreStats> CheckpointManager::Restore(
    std::optional<int64_t> step, absl::Span<const RestoreTarget> targets) {
  return impl_->Restore(step, targets);
}
absl::StatusOr<std::vector<int64_t>> CheckpointManager::List() const {
  return impl_->List();
}
absl::StatusOr<std::optional<int64_t>> CheckpointManager::Latest() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, impl_->List());
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}
absl::StatusOr<VerifyReport> CheckpointManager::Verify(int64_t step) const {
  return impl_->Verify(step);
}
absl::Status CheckpointManager::Delete(int64_t step) {
  return impl_->Delete(step);
}
const std::string& CheckpointManager::root() const { return impl_->root(); }

}  // namespace hoist
