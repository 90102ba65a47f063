// CheckpointManager::Open as its steps: the options checked, the storages
// chosen, the root locked by rank 0 and seen by every rank, the job's
// topology, the local tier, the pool (pinned now unless a restore may come
// first) and the host memory budget.
#include <atomic>

#include "hoist/checkpoint/manager_impl.h"

namespace hoist {
namespace {

absl::Status ValidateOptions(const CheckpointManagerOptions& options,
                             const Coordinator& coordinator) {
  if (options.pool_bytes <= 0 || options.keep_last < 0 ||
      options.keep_every < 0 || options.max_in_flight < 1 ||
      options.frozen_check_every < 0) {
    return absl::InvalidArgumentError(
        "checkpoint manager options: pool_bytes and max_in_flight must be "
        "positive, keep_last, keep_every and frozen_check_every "
        "non-negative");
  }
  SavePlanOptions plan = options.plan;  // 0 streams: the storage's number
  for (int streams :
       {options.plan.writer_streams, options.local.writer_streams}) {
    plan.writer_streams = streams == 0 ? 1 : streams;
    if (absl::Status valid = ValidateSavePlanOptions(plan); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint manager options: plan: ", valid.message()));
    }
  }
  if (options.persist_every < 1 || options.local.every < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint manager options: persist_every (%d) and local.every (%d) "
        "must be at least 1",
        options.persist_every, options.local.every));
  }
  if (options.when_busy == CheckpointManagerOptions::WhenBusy::kSkip &&
      coordinator.size() > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint manager options: when_busy skip needs every rank to skip "
        "the same saves, which %d processes cannot yet agree on; use wait",
        coordinator.size()));
  }
  if (!options.preemption.signals.empty() &&
      (options.preemption.deadline <= absl::ZeroDuration() ||
       options.preemption.poll <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "checkpoint manager options: preemption deadline and poll must be "
        "positive");
  }
  return absl::OkStatus();
}

// The root's storage (the caller's, or opened from its URL) and the local
// filesystem for the local tier: the same one unless the root's is not
// local (an object store). `owned` keeps what was opened here.
struct Storages {
  Storage* root = nullptr;
  Storage* local = nullptr;
  std::vector<std::unique_ptr<Storage>> owned;
};

absl::StatusOr<Storages> ChooseStorages(const std::string& root,
                                        const CheckpointManagerOptions& options,
                                        Storage* given) {
  Storages out;
  out.root = out.local = given;
  if (given == nullptr) {
    ASSIGN_OR_RETURN(out.owned.emplace_back(),
                     OpenStorage(root, options.storage()));
    out.root = out.local = out.owned.back().get();
  }
  if (!out.root->capabilities().local && !options.local.root.empty()) {
    ASSIGN_OR_RETURN(out.owned.emplace_back(),
                     OpenLocalStorage(options.storage()));
    out.local = out.owned.back().get();
  }
  return out;
}

// One lock per job: rank 0 opens the root (creating it, taking its lock
// and recovering it), then tells the others, who open it for reading and
// check that they see its lock (the same filesystem).
absl::StatusOr<std::unique_ptr<CheckpointRoot>> OpenRootOnEveryRank(
    const std::string& root, Storage& storage, Coordinator& coordinator) {
  std::unique_ptr<CheckpointRoot> opened_root;
  absl::Status opened;
  if (coordinator.rank() == 0) {
    absl::StatusOr<std::unique_ptr<CheckpointRoot>> r =
        CheckpointRoot::Open(root, &storage);
    opened = r.status();
    if (r.ok()) opened_root = *std::move(r);
  }
  // The lock's token, or "!" and rank 0's error.
  ASSIGN_OR_RETURN(
      std::string token,
      coordinator.Broadcast(
          "open",
          opened.ok() ? (opened_root != nullptr ? opened_root->lock_token()
                                                : std::string())
                      : absl::StrCat("!", EncodeStatus(opened)),
          0));
  RETURN_IF_ERROR(opened);
  if (absl::StartsWith(token, "!")) return DecodeStatus(token.substr(1), 0);
  if (coordinator.rank() != 0) {
    ASSIGN_OR_RETURN(opened_root,
                     CheckpointRoot::OpenForReading(root, &storage));
    RETURN_IF_ERROR(opened_root->CheckLockHolder(token));
  }
  return opened_root;
}

// Whether the pool is pinned at open: unless a restore may come first, and
// a root (and local tier) without a committed step has nothing to restore
// (see PoolPinning).
bool PinPoolAtOpen(const CheckpointManagerOptions& options,
                   const CheckpointRoot& root, LocalTier* local) {
  if (options.pool_pinning == CheckpointManagerOptions::PoolPinning::kAtOpen) {
    return true;
  }
  absl::StatusOr<std::vector<int64_t>> steps = root.List();
  bool pin_now = !steps.ok() || steps->empty();
  if (local != nullptr && pin_now) {
    steps = local->own().List();
    pin_now = !steps.ok() || steps->empty();
  }
  return pin_now;
}

// `options` with writer streams 0 resolved to the storage's choice: the
// root's for durable saves, the local filesystem's for the local tier's
// parts.
CheckpointManagerOptions ResolveWriterStreams(
    const CheckpointManagerOptions& options, const Storages& storages) {
  CheckpointManagerOptions resolved = options;
  if (resolved.local.writer_streams == 0) {
    resolved.local.writer_streams =
        options.plan.writer_streams != 0
            ? options.plan.writer_streams
            : storages.local->preferred_writer_streams();
  }
  if (resolved.plan.writer_streams == 0) {
    resolved.plan.writer_streams = storages.root->preferred_writer_streams();
  }
  return resolved;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    const std::string& root, Backend& backend, Coordinator& coordinator,
    const CheckpointManagerOptions& options, Storage* storage) {
  RETURN_IF_ERROR(ValidateOptions(options, coordinator));
  std::unique_ptr<MetricsLog> metrics;
  if (!options.metrics_path.empty()) {
    ASSIGN_OR_RETURN(
        metrics, MetricsLog::Open(options.metrics_path, coordinator.rank()));
  }
  ASSIGN_OR_RETURN(Storages storages, ChooseStorages(root, options, storage));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointRoot> opened_root,
                   OpenRootOnEveryRank(root, *storages.root, coordinator));
  ASSIGN_OR_RETURN(Topology topology, GatherTopology(backend, coordinator));
  ASSIGN_OR_RETURN(Topology part_topology,
                   PartTopology(topology, coordinator.rank()));
  std::unique_ptr<LocalTier> local;
  if (!options.local.root.empty()) {
    ASSIGN_OR_RETURN(
        local,
        LocalTier::Open(options.local.root, options.local.replicas,
                        options.local.keep_last, coordinator, *storages.local));
  }
  const bool pin_now = PinPoolAtOpen(options, *opened_root, local.get());
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   pin_now ? StagingPool::Create(backend, options.pool_bytes)
                           : StagingPool::CreatePending(options.pool_bytes));
  ASSIGN_OR_RETURN(const int64_t host_memory_budget,
                   HostMemoryBudgetBytes(options.host_memory_budget,
                                         options.pool_bytes, coordinator));
  std::unique_ptr<PreemptionWatch> preemption;
  if (!options.preemption.signals.empty()) {
    // Every rank opens its managers in the same order, so the n-th
    // manager's board has the same name on every rank.
    static std::atomic<int> boards{0};
    ASSIGN_OR_RETURN(
        preemption,
        PreemptionWatch::Start(
            coordinator,
            {.signals = options.preemption.signals,
             .poll = options.preemption.poll,
             .agree_timeout = options.preemption.deadline,
             .board = absl::StrCat("preemption ", boards.fetch_add(1))},
            options.on_warning));
  }
  CheckpointManagerOptions resolved = ResolveWriterStreams(options, storages);
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::make_unique<Impl>(
          std::move(opened_root), backend, coordinator, std::move(resolved),
          std::move(storages.owned), std::move(topology),
          std::move(part_topology), std::move(local), std::move(pool), pin_now,
          host_memory_budget, std::move(metrics), std::move(preemption))));
}

}  // namespace hoist
