// The checkpoint manager. Save() plans on the caller's thread (the
// SavePlanner reuses the last plan when the arrays' specs have not changed,
// as in a training loop, so planning stays off the time training is
// blocked) and queues a job; the saver thread runs jobs in order (stage,
// persist, commit: see save/save.cc), reporting each stage through the
// job's promises, then applies retention (manager_save.cc). Restores:
// manager_restore.cc. A job's error that Save() did not already return is
// kept and returned by the next call, so no background error is ever lost.
#include "hoist/checkpoint/manager_impl.h"

namespace hoist {

absl::Status SaveHandle::status() const {
  if (!committed_.ready()) {
    return absl::UnavailableError(
        absl::StrFormat("step %d is still being saved", step_));
  }
  return committed_.Wait().status();
}

absl::Status SaveHandle::WaitStagedOn(void* stream) const {
  const absl::StatusOr<CopyFences>& fences = dispatched_.Wait();
  if (!fences.ok()) return fences.status();
  if (fences->empty()) return WaitStaged();
  for (const std::shared_ptr<const CopyFence>& fence : *fences) {
    RETURN_IF_ERROR(fence->OrderStream(stream));
  }
  return absl::OkStatus();
}

CheckpointManager::Impl::Impl(std::unique_ptr<CheckpointRoot> root,
                              Backend& backend, Coordinator& coordinator,
                              CheckpointManagerOptions options,
                              std::vector<std::unique_ptr<Storage>> owned,
                              Topology topology, Topology part_topology,
                              std::unique_ptr<LocalTier> local,
                              std::unique_ptr<StagingPool> pool,
                              bool pool_pinned, int64_t host_memory_budget,
                              std::unique_ptr<MetricsLog> metrics,
                              std::unique_ptr<PreemptionWatch> preemption)
    : owned_storage_(std::move(owned)),
      root_(std::move(root)),
      storage_(root_->storage()),
      backend_(backend),
      coordinator_(coordinator),
      options_(std::move(options)),
      local_(std::move(local)),
      pool_(std::move(pool)),
      host_memory_budget_(host_memory_budget),
      overflow_(backend_, host_memory_budget - pool_->capacity_bytes()),
      engine_(*pool_, TransferOptions{.tracer = options_.tracer}),
      planner_(options_.plan, options_.local.writer_streams,
               std::move(topology), std::move(part_topology),
               coordinator_.rank(), engine_, backend_, options_.frozen),
      metrics_(std::move(metrics)),
      stall_watch_(options_.stall_warn, coordinator_.rank(),
                   options_.on_warning),
      restore_watch_(options_.stall_warn, coordinator_.rank(),
                     options_.on_warning),
      preemption_(std::move(preemption)) {
  {
    absl::StatusOr<std::vector<int64_t>> steps = root_->List();
    MutexLock lock(&mu_);
    highest_step_ = !steps.ok()      ? std::numeric_limits<int64_t>::max()
                    : steps->empty() ? -1
                                     : steps->back();
  }
  if (pool_pinned) {
    MutexLock lock(&pin_mu_);
    pinning_started_ = true;  // the pool came pinned
  }
  // The saver keeps the process's share of the cores: what it does
  // before the copies are dispatched is on the training loop's clock
  // (whenever the loop waits for it, the loop's core is free for it).
  // It runs under SCHED_BATCH so that a Save handing it a job never
  // loses the caller's core to it: on 2 cores that wake-up took the
  // caller's core for 3-14 ms on about one dispatched-mode save in four
  // of `hoist demo`. The writers it starts, which write and hash, lower
  // their priority.
  saver_ = std::thread([this] {
    NameThisThread("hoist-saver");
    MakeThisThreadBatch().IgnoreError();  // advice
    SaverLoop();
  });
}

void CheckpointManager::Impl::LowerPriority() const {
  switch (options_.background_priority) {
    case CheckpointManagerOptions::BackgroundPriority::kNormal:
      return;
    case CheckpointManagerOptions::BackgroundPriority::kLow:
      LowerThisThreadPriority(10, false).IgnoreError();
      return;
    case CheckpointManagerOptions::BackgroundPriority::kIdle:
      LowerThisThreadPriority(0, true).IgnoreError();
      return;
  }
}

void CheckpointManager::Impl::StartPinning() {
  MutexLock lock(&pin_mu_);
  if (std::exchange(pinning_started_, true)) return;
  pinner_ = std::thread([this] {
    NameThisThread("hoist-pinner");
    LowerPriority();
    pool_->Provide(backend_.AllocatePinned(pool_->capacity_bytes()));
  });
}

CheckpointManager::Impl::~Impl() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  saver_.join();
  MutexLock lock(&pin_mu_);
  if (pinner_.joinable()) pinner_.join();
}

Durability CheckpointManager::Impl::durability() const {
  MutexLock lock(&mu_);
  Durability out;
  out.skipped_saves = skipped_saves_;
  out.last_committed_step = last_committed_step_;
  out.last_committed = last_committed_;
  out.in_flight = static_cast<int64_t>(in_flight_steps_.size());
  return out;
}

absl::Status CheckpointManager::Impl::Delete(int64_t step) {
  {
    MutexLock lock(&mu_);
    if (in_flight_steps_.contains(step)) {
      return absl::FailedPreconditionError(
          absl::StrFormat("step %d is being saved", step));
    }
    if (last_manifest_ != nullptr && last_manifest_->step() == step) {
      last_manifest_ = nullptr;  // no longer a base
      frozen_ready_ = nullptr;
    }
    // A save in flight may reference the newest committed step's bytes
    // (deltas): only its own commit protects them from a delete.
    if (!in_flight_steps_.empty()) {
      absl::StatusOr<std::vector<int64_t>> steps = root_->List();
      if (steps.ok() && !steps->empty() && steps->back() == step) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "step %d is the newest committed step, and the save in flight "
            "may reference its bytes: delete it after WaitUntilFinished()",
            step));
      }
    }
  }
  return root_->Delete(step);
}

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CheckpointManager::~CheckpointManager() = default;

absl::StatusOr<SaveHandle> CheckpointManager::Save(
    int64_t step, absl::Span<const SaveArray> arrays, std::string metadata_json,
    ReturnWhen return_when, const SaveOptions& options) {
  return impl_->Save(step, arrays, std::move(metadata_json), return_when,
                     options);
}
absl::StatusOr<RegisteredArrays> CheckpointManager::Register(
    absl::Span<const SaveArray> arrays) {
  return impl_->Register(arrays);
}
absl::StatusOr<SaveHandle> CheckpointManager::Save(
    int64_t step, const RegisteredArrays& registered, std::string metadata_json,
    ReturnWhen return_when, const SaveOptions& options) {
  return impl_->Save(step, registered, std::move(metadata_json), return_when,
                     options);
}
absl::StatusOr<bool> CheckpointManager::ReachedPreemption(int64_t step) {
  return impl_->ReachedPreemption(step);
}

absl::Status CheckpointManager::NotePreemption() {
  return impl_->NotePreemption();
}

absl::Status CheckpointManager::WaitUntilFinished() {
  return impl_->WaitUntilFinished();
}
Durability CheckpointManager::durability() const { return impl_->durability(); }
int64_t CheckpointManager::host_memory_budget() const {
  return impl_->host_memory_budget();
}

absl::StatusOr<int64_t> ResolveHostMemoryBudget(
    const CheckpointManagerOptions& options, Coordinator& coordinator) {
  return HostMemoryBudgetBytes(options.host_memory_budget, options.pool_bytes,
                               coordinator);
}
void CheckpointManager::PinPool() { impl_->StartPinning(); }
absl::StatusOr<RestoreStats> CheckpointManager::Restore(
    std::optional<int64_t> step, absl::Span<const RestoreTarget> targets,
    const RestoreReceiver& receiver,
    const std::optional<RestoreOptions>& options) {
  return impl_->Restore(step, targets, receiver, options);
}
absl::StatusOr<CheckpointManager::PreparedRestore>
CheckpointManager::PrepareRestore(std::optional<int64_t> step) {
  return impl_->PrepareRestore(step);
}
absl::StatusOr<std::vector<int64_t>> CheckpointManager::List() const {
  return impl_->List();
}
absl::StatusOr<std::optional<int64_t>> CheckpointManager::Latest() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, impl_->List());
  if (steps.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(steps.back());
}
absl::StatusOr<VerifyReport> CheckpointManager::Verify(
    int64_t step, OperationProgress* progress) const {
  return impl_->Verify(step, progress);
}
absl::StatusOr<Manifest> CheckpointManager::ReadManifest(int64_t step) const {
  return impl_->ReadManifest(step);
}
absl::Status CheckpointManager::Delete(int64_t step) {
  return impl_->Delete(step);
}
const std::string& CheckpointManager::root() const { return impl_->root(); }

}  // namespace hoist
