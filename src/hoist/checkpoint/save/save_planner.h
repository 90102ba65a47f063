// What a CheckpointManager's save stages, decided on the caller's thread:
// the plan of the arrays' specs for the save's tier and this process's
// share of it laid out for staging (kept, and reused while the specs stay
// the same, as in a training loop, so planning stays off the time training
// is blocked), and where the arrays' shards are. The manager (its queue,
// saver thread and retention) is checkpoint/manager_save.cc.
#ifndef HOIST_CHECKPOINT_SAVE_SAVE_PLANNER_H_
#define HOIST_CHECKPOINT_SAVE_SAVE_PLANNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

// A plan of a tier, and what it was made from.
struct TierPlan {
  std::shared_ptr<const std::vector<ArraySpec>> specs;
  std::shared_ptr<const SavePlan> plan;
  // This process's share of `plan` laid out for staging (once per plan,
  // not per save: a pass over the job's slices costs, more so at many
  // processes and 100,000 arrays); null when the engine refused the
  // share, and `refused` says why.
  std::shared_ptr<const StagingLayout> layout;
  absl::Status refused;
  // Per plan slice, 1 for a frozen array's (null when there is none), and
  // the share laid out without them (null when the engine refused it).
  std::shared_ptr<const std::vector<uint8_t>> frozen;
  std::shared_ptr<const StagingLayout> unfrozen_layout;
};

// A registration: the arrays' specs and shards, and per tier (durable,
// local) the plan, its layout and the stable sources, made at the first
// save of the tier (the durable tier's at Register).
class RegisteredArrays::State {
 public:
  uint64_t owner = 0;  // the registering manager's id
  std::shared_ptr<const std::vector<ArraySpec>> specs;
  std::shared_ptr<const ShardSources> sources;
  Mutex mu;
  TierPlan tiers[2] ABSL_GUARDED_BY(mu);
  // Per tier, for `layout` and for `unfrozen_layout`.
  std::shared_ptr<StableSources> stable[2] ABSL_GUARDED_BY(mu);
  std::shared_ptr<StableSources> unfrozen_stable[2] ABSL_GUARDED_BY(mu);
};

// What one save stages.
struct PlannedSave {
  // What `plan` was made from, and its layout; all shared with later saves
  // of the same specs.
  std::shared_ptr<const std::vector<ArraySpec>> specs;
  std::shared_ptr<const SavePlan> plan;
  // Null when the engine refused the share (the saver's staging reports
  // why).
  std::shared_ptr<const StagingLayout> layout;
  std::shared_ptr<const ShardSources> sources;
  // Registered arrays': their sources resolved for `layout`, and the
  // copies prepared from them (null for Save(step, arrays)).
  std::shared_ptr<StableSources> stable;
  // Frozen arrays (CheckpointManagerOptions::frozen), for the durable
  // tier: per plan slice, 1 for a frozen array's (null when there is
  // none); the layout and stable sources of the share without them.
  std::shared_ptr<const std::vector<uint8_t>> frozen;
  std::shared_ptr<const StagingLayout> unfrozen_layout;
  std::shared_ptr<StableSources> unfrozen_stable;
  // Makes the shards marked produced (SaveOptions::producer), if any.
  std::shared_ptr<ShardProducer> producer;

  // Leaves the frozen arrays' slices out of staging (they are referenced
  // in the base step instead).
  void SkipFrozen() {
    layout = unfrozen_layout;
    stable = unfrozen_stable;
  }
};

// The job's topology (every process's devices, in rank order), gathered.
absl::StatusOr<Topology> GatherTopology(Backend& backend,
                                        Coordinator& coordinator);

// The topology a process plans its local part with: its own devices as
// process 0, every other device as process 1 (SavePlanOptions::
// part_of_process 0 then plans exactly what this process holds, and the
// part's data files are named as process 0's).
absl::StatusOr<Topology> PartTopology(const Topology& topology, int rank);

class SavePlanner {
 public:
  // `part_topology`: PartTopology(topology, rank); `part_writer_streams`:
  // the writer streams of a local part's plan (`options`' for durable
  // saves). `engine` and `backend` must outlive the planner.
  // `frozen`: CheckpointManagerOptions::frozen.
  SavePlanner(SavePlanOptions options, int part_writer_streams,
              Topology topology, Topology part_topology, int rank,
              const TransferEngine& engine, Backend& backend,
              std::function<bool(std::string_view)> frozen = nullptr);

  // The plan of `arrays` for `tier`: the previous one of that tier if the
  // specs are the same (compared in place, nothing copied), else a new
  // one; and the arrays' sources (AddShards' errors). One pass over the
  // arrays does both: after a training step the caller's arrays and the
  // cached specs are both cold (at 3 GiB, 1,453 of each), and their misses
  // overlap, fetched a few arrays ahead.
  absl::StatusOr<PlannedSave> PlanFor(absl::Span<const SaveArray> arrays,
                                      Tier tier) ABSL_LOCKS_EXCLUDED(mu_);

  // A registration of `arrays` (owned by manager `owner`), its durable
  // tier planned now so that the plan's errors are Register's.
  absl::StatusOr<std::shared_ptr<RegisteredArrays::State>> Register(
      absl::Span<const SaveArray> arrays, uint64_t owner) const;

  // PlanFor for registered arrays: nothing is read per array.
  absl::StatusOr<PlannedSave> PlanRegistered(RegisteredArrays::State& state,
                                             Tier tier) const;

  // This process's index in a plan of `tier`: its rank, or 0 in a local
  // part's plan (PartTopology).
  int PlanProcess(Tier tier) const;

 private:
  // Adds `array`'s shards to `sources` as array `a`; kInvalidArgument for
  // a shard with no data or not on this process's devices. An array with no
  // elements has nothing to read: its shards may have no data (PyTorch's
  // empty tensors do not). Runs per array at every save given its arrays:
  // the shape is looked at only for a shard without data, and not copied.
  static absl::Status AddShards(const SaveArray& array, int a,
                                ShardSources& sources);
  // The plan of `specs` for `tier` (a local step saves this process's
  // part), and its layout.
  absl::StatusOr<TierPlan> PlanTier(
      std::shared_ptr<const std::vector<ArraySpec>> specs, Tier tier) const;
  // `state`'s plan of `tier`, made at its first use; the engine's refusal
  // of the share is its error.
  absl::Status PlanTierOf(RegisteredArrays::State& state, Tier tier) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu);

  const SavePlanOptions options_;
  const int part_writer_streams_;
  const std::function<bool(std::string_view)> frozen_;
  const Topology topology_;
  const Topology part_topology_;  // PartTopology
  const int rank_;
  const TransferEngine& engine_;  // Lay only: const, beside any staging
  Backend& backend_;
  // The ids of backend_'s devices, which never change: a save's sources
  // take shards on these only.
  const std::vector<DeviceId> local_devices_;

  // The last plan of each tier (durable, local), and what it was made from.
  Mutex mu_;
  TierPlan planned_[2] ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_SAVE_PLANNER_H_
