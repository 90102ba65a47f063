// CheckpointManager::Impl: the manager's state and the steps it runs,
// shared by checkpoint_manager.cc (the manager's life: open, pinning,
// retention's deletes, closing), manager_save.cc (Save, the saver thread)
// and manager_restore.cc (restores from either tier). Private to
// checkpoint/.
#ifndef HOIST_CHECKPOINT_MANAGER_IMPL_H_
#define HOIST_CHECKPOINT_MANAGER_IMPL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <thread>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/thread_priority.h"
#include "hoist/checkpoint/metrics_log.h"
#include "hoist/checkpoint/preemption.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/restore/shared_restore.h"
#include "hoist/checkpoint/save/host_memory.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/checkpoint/save/save_planner.h"
#include "hoist/checkpoint/stall_watch.h"
#include "hoist/checkpoint/tier/local_tier.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/coord/status_wire.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

class CheckpointManager::Impl {
 public:
  // One save, from Save() to its commit.
  struct Job {
    int64_t step = 0;
    Tier tier = Tier::kDurable;
    PlannedSave planned;
    std::string metadata_json;
    bool deltas = true;         // SaveRequest::deltas
    std::string per_rank_json;  // SaveRequest::per_rank_json
    // SaveRequest::frozen_base: >= 0 when the frozen arrays are not staged.
    int64_t frozen_base = -1;
    absl::Time start;
    // When Save() was called, when it had planned, and when the copies
    // began (the first phases: SaveInfo::phases).
    absl::Time accepted, planned_at, staging_began = absl::InfinitePast();
    Promise<CopyFences> dispatched;
    Promise<> staged;
    Promise<SaveInfo> committed;
    std::shared_ptr<SaveProgress> progress = std::make_shared<SaveProgress>();
    absl::Duration dispatched_after, staged_after;
    // The first wave, when Save() dispatched it (DispatchHere), and whether
    // `dispatched` is already set.
    std::unique_ptr<BegunSave> begun;
    bool dispatch_reported = false;
    // The preemption save (CheckpointManager::ReachedPreemption): no
    // retention, and it fails unless it can commit by `deadline`.
    bool preemption = false;
    absl::Time deadline = absl::InfiniteFuture();
    // Set by Save() once it has returned, and whether it returned an error.
    Notification save_returned;
    bool error_returned = false;
  };

  using PoolPinning = CheckpointManagerOptions::PoolPinning;

  Impl(std::unique_ptr<CheckpointRoot> root, Backend& backend,
       Coordinator& coordinator, CheckpointManagerOptions options,
       std::vector<std::unique_ptr<Storage>> owned, Topology topology,
       Topology part_topology, std::unique_ptr<LocalTier> local,
       std::unique_ptr<StagingPool> pool, bool pool_pinned,
       int64_t host_memory_budget, std::unique_ptr<MetricsLog> metrics,
       std::unique_ptr<PreemptionWatch> preemption);

  // Lowers the calling background thread's priority as the options say
  // (advice: a system that refuses leaves it as it was).
  void LowerPriority() const;

  // Starts pinning a pending pool in the background, once (see
  // PoolPinning::kBackground).
  void StartPinning();

  ~Impl();

  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  absl::Span<const SaveArray> arrays,
                                  std::string metadata_json,
                                  ReturnWhen return_when,
                                  const SaveOptions& save_options);

  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  const RegisteredArrays& registered,
                                  std::string metadata_json,
                                  ReturnWhen return_when,
                                  const SaveOptions& save_options);

  absl::StatusOr<RegisteredArrays> Register(absl::Span<const SaveArray> arrays);

  // Save, with `plan` setting the job's plan, layout and sources.
  absl::StatusOr<SaveHandle> SaveWith(
      int64_t step, std::string metadata_json, ReturnWhen return_when,
      const SaveOptions& save_options,
      absl::FunctionRef<absl::Status(Job&)> plan);

  absl::StatusOr<bool> ReachedPreemption(int64_t step) {
    if (preemption_ == nullptr) return false;
    return preemption_->Reached(step);
  }
  absl::Status NotePreemption();

  absl::Status WaitUntilFinished() {
    AwaitIdle();
    return TakeDeferredError();
  }

  absl::StatusOr<std::vector<int64_t>> List() const { return root_->List(); }

  Durability durability() const;

  absl::StatusOr<PreparedRestore> PrepareRestore(std::optional<int64_t> step);

  absl::StatusOr<RestoreStats> Restore(
      std::optional<int64_t> step, absl::Span<const RestoreTarget> targets,
      const RestoreReceiver& receiver,
      const std::optional<RestoreOptions>& options);

  absl::StatusOr<Manifest> ReadManifest(int64_t step) const {
    return root_->ReadManifest(step);
  }

  absl::StatusOr<VerifyReport> Verify(int64_t step,
                                      OperationProgress* progress) const {
    return root_->Verify(step, progress);
  }

  absl::Status Delete(int64_t step);

  const std::string& root() const { return root_->path(); }
  int64_t host_memory_budget() const { return host_memory_budget_; }

 private:
  // kNotFound for a restore that neither tier can serve.
  absl::Status NoStepInEitherTier(std::optional<int64_t> step,
                                  const std::string& note) const;

  // The newest committed durable step; kNotFound when there is none.
  absl::StatusOr<int64_t> NewestDurable() const;

  absl::StatusOr<RestoreStats> RestoreDurable(
      int64_t step,
      const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
          restore);

  // Dispatches `job`'s first wave on this (the caller's) thread, for the
  // saver to finish; when that was every copy, the job is dispatched now.
  // The caller returns without waiting for the saver thread to wake, which
  // on cores busy with the copies themselves (the host backend) or with
  // training took milliseconds. Only while the saver is idle (nothing in
  // flight): the engine and the pool serve one save at a time. A share
  // Begin refuses is left to the saver, whose staging reports the error.
  void DispatchHere(Job& job);

  // Whether `job` copies its frozen arrays (CheckpointManagerOptions::
  // frozen): not when the last step this manager committed holds them
  // from the same plan (every slice of it, hashed), unless this save is
  // one that checks them.
  void ChooseFrozen(Job& job);

  // A handle whose every wait returns at once: the save was skipped.
  static SaveHandle SkippedHandle(int64_t step);

  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(in_flight_steps_.size()) <
           std::max(1, options_.max_in_flight);
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_steps_.empty();
  }
  // Returns once no save is in flight (the saver then leaves the
  // coordinator to the caller's collectives).
  void AwaitIdle();
  bool HasJobOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Status TakeDeferredError();

  // Deletes committed steps beyond keep_last (sparing multiples of
  // keep_every), never `newest` (just committed) or a step in flight.
  absl::Status ApplyRetention(int64_t newest);

  void SaverLoop();

  absl::StatusOr<SaveInfo> Run(Job& job);
  // A committed durable step's retention, timed as the save's last phase.
  void Retain(const Job& job, SaveInfo& info);
  // A committed save's phases completed (SaveInfo::elapsed) and reported.
  void ReportSave(const Job& job, SaveInfo& info);
  // A restore's phases completed (the time outside them is planning),
  // stamped with this rank, and reported.
  void FinishPhases(absl::Time began, RestoreStats& stats);
  // Appends a save's or a restore's phases to the metrics and the trace.
  void ReportPhases(const PhaseReport& report, absl::Time began);

  // A fence after the copies dispatched so far on each local device that
  // has them (WaitStagedOn). None at all when a device fails to make one:
  // WaitStagedOn then waits on the CPU, which is slower but as safe, and
  // the save goes on (its copies are already in flight).
  CopyFences FenceCopies();

  // The tier of `step`'s save, and for the preemption save (the first at
  // or past the agreed step) its deadline; nullopt: the step is skipped.
  std::optional<Tier> ChooseTier(int64_t step, Job& job);

  // Unique in the process (an address may be reused by a later manager):
  // a registration is saved only by the manager that made it.
  const uint64_t id_ = [] {
    static std::atomic<uint64_t> managers{0};
    return ++managers;
  }();
  // The root's storage and the local tier's, when the manager made them;
  // before the root and the tier using them.
  const std::vector<std::unique_ptr<Storage>> owned_storage_;
  const std::unique_ptr<CheckpointRoot> root_;
  Storage& storage_;
  Backend& backend_;
  Coordinator& coordinator_;
  const CheckpointManagerOptions options_;
  const std::unique_ptr<LocalTier> local_;  // null without a local tier
  // The local tier's parts commit alone (rank 0 of 1); replication then
  // goes through coordinator_.
  const std::unique_ptr<Coordinator> alone_ = MakeSingleProcessCoordinator();
  const std::unique_ptr<StagingPool> pool_;
  // The pool and its overflow together stay within it (bytes).
  const int64_t host_memory_budget_;
  // Grown only in Save() while the saver is idle (no staging runs).
  StagingOverflow overflow_;
  // Stages on the saver thread, and in Save() while the saver is idle;
  // Lay (const: it reads only the pool's fixed capacity) runs in Save() at
  // any time.
  TransferEngine engine_;

  // Plans saves on the caller's thread (its Lay beside any staging).
  SavePlanner planner_;
  // Where each save's and restore's phases are appended (null: nowhere),
  // and the watch over the save the saver runs.
  const std::unique_ptr<MetricsLog> metrics_;
  StallWatch stall_watch_;
  // The watch over the restore under way (Restore: one at a time).
  StallWatch restore_watch_;
  // Agrees on the preemption step (null without preemption signals).
  const std::unique_ptr<PreemptionWatch> preemption_;
  bool preemption_saved_ = false;  // by Save() (one thread at a time)

  mutable Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int64_t> in_flight_steps_ ABSL_GUARDED_BY(mu_);
  // No durable step above this one exists: the root's highest at Open,
  // raised by every save since (INT64_MAX when the root could not be
  // listed). Save asks storage whether a step exists only at or below it:
  // a training run's steps grow, and the stat cost each save 40 µs on the
  // training thread. A step made above it behind this manager's back (the
  // root's lock forbids it) is still refused, by the saver before it writes
  // (SaveCheckpoint checks the step too), and at the commit (CommitStep).
  int64_t highest_step_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status deferred_error_ ABSL_GUARDED_BY(mu_);
  // The manifest of the last durable step this manager committed: the
  // next save's base when it is still the newest (SaveRequest::base_hint).
  std::shared_ptr<const IndexedManifest> last_manifest_ ABSL_GUARDED_BY(mu_);
  // The plan that step was saved with (with deltas): its frozen arrays'
  // slices are all in it, so saves of that plan may leave them out.
  std::shared_ptr<const SavePlan> frozen_ready_ ABSL_GUARDED_BY(mu_);
  // The durable plan whose PlanFingerprint the saver made last, and that
  // fingerprint: a training loop's saves of one plan make it once (it
  // encodes the whole plan). The saver thread's alone.
  std::shared_ptr<const SavePlan> fingerprinted_plan_;
  uint64_t plan_fingerprint_ = 0;
  // Saves that could leave the frozen arrays out (frozen_check_every).
  int64_t frozen_saves_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_saves_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> last_committed_step_ ABSL_GUARDED_BY(mu_);
  absl::Time last_committed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Mutex pin_mu_;
  bool pinning_started_ ABSL_GUARDED_BY(pin_mu_) = false;
  std::thread pinner_ ABSL_GUARDED_BY(pin_mu_);  // pins the pool, then ends
  std::thread saver_;  // last: started once everything above exists
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_MANAGER_IMPL_H_
