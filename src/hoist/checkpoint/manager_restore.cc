// The manager's restores: the step chosen (from the local tier or the
// durable root), then read by every rank for itself or once per job
// (restore/shared_restore.h), onto any sharding.
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "hoist/checkpoint/manager_impl.h"

namespace hoist {

absl::StatusOr<CheckpointManager::PreparedRestore>
CheckpointManager::Impl::PrepareRestore(std::optional<int64_t> step) {
  RETURN_IF_ERROR(TakeDeferredError());
  PreparedRestore prepared;
  if (local_ != nullptr && options_.restore.local_tier) {
    AwaitIdle();
    Storage& storage = local_->own().storage();
    ASSIGN_OR_RETURN(
        LocalTier::Outcome outcome,
        local_->Restore(
            step, List().value_or(std::vector<int64_t>{}),
            [&](const std::string& dir) -> absl::StatusOr<RestoreStats> {
              ASSIGN_OR_RETURN(prepared.manifest,
                               ReadManifestFile(storage, dir));
              return RestoreStats{};
            }));
    if (outcome.none) return NoStepInEitherTier(step, outcome.note);
    prepared.step = outcome.step;
    prepared.note = outcome.note;
    prepared.bytes_received = outcome.received_bytes;
    if (outcome.stats) {
      prepared.tier = Tier::kLocal;
      return prepared;
    }
    step = outcome.step;
  }
  if (!step) {
    ASSIGN_OR_RETURN(step, NewestDurable());
  }
  prepared.step = *step;
  prepared.tier = Tier::kDurable;
  // Its head: a caller builds its targets from the arrays' names, dtypes
  // and shapes, and the restore reads the extents it needs.
  ASSIGN_OR_RETURN(ManifestHead head, root_->ReadManifestHead(*step));
  prepared.manifest = std::move(head.manifest);
  return prepared;
}

absl::StatusOr<RestoreStats> CheckpointManager::Impl::Restore(
    std::optional<int64_t> step, absl::Span<const RestoreTarget> targets,
    const RestoreReceiver& receiver,
    const std::optional<RestoreOptions>& options) {
  const absl::Time began = absl::Now();
  RETURN_IF_ERROR(TakeDeferredError());
  RestoreOptions chosen = options.value_or(options_.restore);
  // Watched for stalls (stall_warn), through the caller's progress or one
  // of its own.
  std::shared_ptr<OperationProgress> watched;
  if (options_.stall_warn > absl::ZeroDuration()) {
    if (chosen.progress == nullptr) {
      watched = std::make_shared<OperationProgress>();
      chosen.progress = watched.get();
    } else {
      watched = std::shared_ptr<OperationProgress>(std::shared_ptr<void>(),
                                                   chosen.progress);
    }
    restore_watch_.WatchRestore(step.value_or(-1), watched);
  }
  const absl::Cleanup unwatch = [&] {
    if (watched != nullptr) restore_watch_.Unwatch();
  };
  const bool needs_pool = absl::c_any_of(targets, [](const auto& target) {
    return absl::c_any_of(target.destinations, [](const auto& dest) {
      return dest.data == nullptr || dest.device != nullptr;
    });
  });
  if (needs_pool) StartPinning();
  // From the durable root, or (local_restore) from the local tier, which
  // has a storage of its own when the root is on an object store.
  const auto restore_from = [&](Storage& storage) {
    return [&](const std::string& dir) {
      return RestoreCheckpoint(storage, dir, targets, *pool_, chosen, receiver);
    };
  };
  // A durable step, in a job of several processes: read once per job
  // (shared_restore.h), collectively; not beside a save, which may be
  // using the coordinator.
  const auto restore =
      [&](const std::string& dir) -> absl::StatusOr<RestoreStats> {
    using Shared = RestoreOptions::SharedReads;
    if (coordinator_.size() == 1 || chosen.shared_reads == Shared::kNever) {
      return RestoreCheckpoint(storage_, dir, targets, *pool_, chosen,
                               receiver);
    }
    AwaitIdle();
    return SharedRestore(coordinator_, storage_, dir, targets, *pool_, chosen,
                         receiver,
                         chosen.shared_reads == Shared::kAlways ||
                             !storage_.capabilities().local);
  };
  absl::StatusOr<RestoreStats> stats;
  if (local_ != nullptr && chosen.local_tier) {
    // Collective: the saver thread must not use the coordinator beside it.
    AwaitIdle();
    ASSIGN_OR_RETURN(
        LocalTier::Outcome outcome,
        local_->Restore(step, List().value_or(std::vector<int64_t>{}),
                        restore_from(local_->own().storage())));
    if (outcome.none) return NoStepInEitherTier(step, outcome.note);
    if (outcome.stats) {
      stats = *std::move(outcome.stats);
      stats->restored_from = Tier::kLocal;
    } else {
      stats = RestoreDurable(outcome.step, restore);
    }
    if (stats.ok()) {
      stats->step = outcome.step;
      stats->note = outcome.note;
      stats->bytes_received = outcome.received_bytes;
    }
  } else {
    if (!step) {
      ASSIGN_OR_RETURN(step, NewestDurable());
    }
    stats = RestoreDurable(*step, restore);
    if (stats.ok()) stats->step = *step;
  }
  // The job goes on to train, then save (unless the caller pins later).
  if (chosen.pin_pool_after) StartPinning();
  if (stats.ok()) FinishPhases(began, *stats);
  return stats;
}

void CheckpointManager::Impl::FinishPhases(absl::Time began,
                                           RestoreStats& stats) {
  // What the restore did besides its own phases (choosing the step and the
  // tier, with the other ranks; a lost part's transfer) is planning.
  stats.elapsed = absl::Now() - began;
  absl::Duration phases;
  for (const PhaseStat& phase : stats.phases) phases += phase.elapsed;
  AddPhases({{"planning",
              std::max(stats.elapsed - phases, absl::ZeroDuration()), 0, 0}},
            stats.phases);
  for (PhaseStat& phase : stats.phases) phase.rank = coordinator_.rank();
  ReportPhases({"restore",
                stats.step,
                stats.restored_from,
                stats.elapsed,
                stats.phases,
                {}},
               began);
}

absl::Status CheckpointManager::Impl::NoStepInEitherTier(
    std::optional<int64_t> step, const std::string& note) const {
  return absl::NotFoundError(absl::StrFormat(
      "%s and the local tier hold no step to restore%s (%s)", root(),
      step ? absl::StrFormat(" numbered %d", *step) : "", note));
}

absl::StatusOr<int64_t> CheckpointManager::Impl::NewestDurable() const {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
  if (steps.empty()) {
    return absl::NotFoundError(
        absl::StrFormat("%s holds no committed step", root()));
  }
  return steps.back();
}

absl::StatusOr<RestoreStats> CheckpointManager::Impl::RestoreDurable(
    int64_t step,
    const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
        restore) {
  ASSIGN_OR_RETURN(const std::string dir, root_->StepDir(step));
  return restore(dir);
}

}  // namespace hoist
