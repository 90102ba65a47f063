// The checkpoint manager. Save() plans on the caller's thread (the
// SavePlanner reuses the last plan when the arrays' specs have not changed,
// as in a training loop, so planning stays off the time training is
// blocked) and queues a job; the saver thread runs jobs in order (stage,
// persist, commit: see save.cc), reporting each stage through the job's
// promises, then applies retention. A job's error that Save() did not already
// return is kept and returned by the next call, so no background error is ever
// lost.
#include "hoist/checkpoint_manager.h"

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
#include "hoist/checkpoint/save/host_memory.h"
#include "hoist/checkpoint/tier/local_tier.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/checkpoint/save/save_planner.h"
#include "hoist/checkpoint/restore/shared_restore.h"
#include "hoist/checkpoint_root.h"
#include "hoist/coord/status_wire.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/transfer/transfer_engine.h"

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

namespace {

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
  Promise<CopyFences> dispatched;
  Promise<> staged;
  Promise<SaveInfo> committed;
  std::shared_ptr<SaveProgress> progress = std::make_shared<SaveProgress>();
  absl::Duration dispatched_after, staged_after;
  // The first wave, when Save() dispatched it (DispatchHere), and whether
  // `dispatched` is already set.
  std::unique_ptr<BegunSave> begun;
  bool dispatch_reported = false;
  // Set by Save() once it has returned, and whether it returned an error.
  Notification save_returned;
  bool error_returned = false;
};

}  // namespace

class CheckpointManager::Impl {
 public:
  using PoolPinning = CheckpointManagerOptions::PoolPinning;

  Impl(std::unique_ptr<CheckpointRoot> root, Backend& backend,
       Coordinator& coordinator, CheckpointManagerOptions options,
       std::vector<std::unique_ptr<Storage>> owned, Topology topology,
       Topology part_topology, std::unique_ptr<LocalTier> local,
       std::unique_ptr<StagingPool> pool, bool pool_pinned,
       int64_t host_memory_budget)
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
                 coordinator_.rank(), engine_, backend_, options_.frozen) {
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

  // Lowers the calling background thread's priority as the options say
  // (advice: a system that refuses leaves it as it was).
  void LowerPriority() const {
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

  // Starts pinning a pending pool in the background, once (see
  // PoolPinning::kBackground).
  void StartPinning() {
    MutexLock lock(&pin_mu_);
    if (std::exchange(pinning_started_, true)) return;
    pinner_ = std::thread([this] {
      NameThisThread("hoist-pinner");
      LowerPriority();
      pool_->Provide(backend_.AllocatePinned(pool_->capacity_bytes()));
    });
  }

  ~Impl() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    saver_.join();
    MutexLock lock(&pin_mu_);
    if (pinner_.joinable()) pinner_.join();
  }

  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  absl::Span<const SaveArray> arrays,
                                  std::string metadata_json,
                                  ReturnWhen return_when,
                                  const SaveOptions& save_options) {
    return SaveWith(step, std::move(metadata_json), return_when, save_options,
                    [&](Job& job) -> absl::Status {
                      ASSIGN_OR_RETURN(job.planned,
                                       planner_.PlanFor(arrays, job.tier));
                      return absl::OkStatus();
                    });
  }

  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  const RegisteredArrays& registered,
                                  std::string metadata_json,
                                  ReturnWhen return_when,
                                  const SaveOptions& save_options) {
    if (registered.state_ == nullptr || registered.state_->owner != id_) {
      return absl::InvalidArgumentError(
          registered.state_ == nullptr
              ? "save of an empty registration: register the arrays with "
                "this manager's Register first"
              : "these arrays were registered with another checkpoint "
                "manager");
    }
    return SaveWith(step, std::move(metadata_json), return_when, save_options,
                    [&](Job& job) -> absl::Status {
                      ASSIGN_OR_RETURN(job.planned,
                                       planner_.PlanRegistered(
                                           *registered.state_, job.tier));
                      return absl::OkStatus();
                    });
  }

  absl::StatusOr<RegisteredArrays> Register(
      absl::Span<const SaveArray> arrays) {
    ASSIGN_OR_RETURN(std::shared_ptr<RegisteredArrays::State> state,
                     planner_.Register(arrays, id_));
    return RegisteredArrays(std::move(state));
  }

  // Save, with `plan` setting the job's plan, layout and sources.
  absl::StatusOr<SaveHandle> SaveWith(
      int64_t step, std::string metadata_json, ReturnWhen return_when,
      const SaveOptions& save_options,
      absl::FunctionRef<absl::Status(Job&)> plan) {
    RETURN_IF_ERROR(TakeDeferredError());
    StartPinning();  // if a restore has not started it
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("step %d is negative", step));
    }
    // Refused here, before the step is accepted: the saver thread must never
    // meet metadata a manifest cannot carry.
    RETURN_IF_ERROR(ValidateMetadataJson(metadata_json));
    // Which tier: a deterministic function of the step, so every rank of a
    // job makes the same choice.
    Tier tier = Tier::kDurable;
    if (step % options_.persist_every != 0) {
      if (local_ == nullptr || step % options_.local.every != 0) {
        return SkippedHandle(step);
      }
      tier = Tier::kLocal;
    }
    if (options_.when_busy == CheckpointManagerOptions::WhenBusy::kSkip) {
      MutexLock lock(&mu_);
      if (!HasRoom()) {
        ++skipped_saves_;
        return SkippedHandle(step);
      }
    }
    auto job = std::make_shared<Job>();
    job->step = step;
    job->tier = tier;
    job->metadata_json = std::move(metadata_json);
    job->deltas = save_options.deltas.value_or(options_.deltas);
    if (!save_options.per_rank_json.empty()) {
      if (static_cast<int64_t>(save_options.per_rank_json.size()) >
          kMaxPerRankJsonBytes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "per-rank state of %d bytes: at most %d (it is for small state: "
            "RNG states, a data loader's position)",
            save_options.per_rank_json.size(), kMaxPerRankJsonBytes));
      }
      RETURN_IF_ERROR(ValidateMetadataJson(
          absl::StrCat("{\"per_rank\": ", save_options.per_rank_json, "}")));
      job->per_rank_json = save_options.per_rank_json;
    }
    RETURN_IF_ERROR(plan(*job));
    ChooseFrozen(*job);
    // A refused share's save fails in staging, having staged nothing.
    job->progress->total_bytes =
        job->planned.layout != nullptr ? job->planned.layout->bytes : 0;
    // Wait for room, then refuse a step that exists or is being saved.
    // Only this thread adds steps (one Save at a time), so a saver idle
    // now stays idle until this job is queued.
    bool saver_idle, may_exist;
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &Impl::HasRoom));
      if (in_flight_steps_.contains(step)) {
        return absl::AlreadyExistsError(
            absl::StrFormat("step %d is already being saved", step));
      }
      saver_idle = in_flight_steps_.empty();
      may_exist = step <= highest_step_;
    }
    // A local step's part is replaced instead: a part of the same number
    // is left from before a restart (its step never completed, or the job
    // went back to an earlier step), and every rank must save alike.
    if (tier == Tier::kDurable && may_exist) {
      ASSIGN_OR_RETURN(bool exists,
                       storage_.HasMarker(JoinPath(root(), StepDirName(step)),
                                          std::string(kManifestFileName)));
      if (exists) {
        return absl::AlreadyExistsError(
            absl::StrFormat("%s: step %d is already committed", root(), step));
      }
    }
    SaveHandle handle(step, job->dispatched.future(), job->staged.future(),
                      job->committed.future(), job->progress);
    job->start = absl::Now();
    job->progress->start = job->start;
    if (saver_idle) {
      // No staging runs now: the overflow may grow for this save.
      if (job->planned.layout != nullptr) {
        engine_.set_overflow(overflow_.Reserve(
            OverflowBytesFor(*job->planned.layout, pool_->capacity_bytes())));
      }
      DispatchHere(*job);
    }
    {
      MutexLock lock(&mu_);
      in_flight_steps_.insert(step);
      if (tier == Tier::kDurable) highest_step_ = std::max(highest_step_, step);
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
    AwaitIdle();
    return TakeDeferredError();
  }

  absl::StatusOr<std::vector<int64_t>> List() const { return root_->List(); }

  Durability durability() const {
    MutexLock lock(&mu_);
    Durability out;
    out.skipped_saves = skipped_saves_;
    out.last_committed_step = last_committed_step_;
    out.last_committed = last_committed_;
    out.in_flight = static_cast<int64_t>(in_flight_steps_.size());
    return out;
  }

  absl::StatusOr<PreparedRestore> PrepareRestore(std::optional<int64_t> step) {
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
    ASSIGN_OR_RETURN(prepared.manifest, root_->ReadManifest(*step));
    return prepared;
  }

  absl::StatusOr<RestoreStats> Restore(
      std::optional<int64_t> step, absl::Span<const RestoreTarget> targets,
      const RestoreReceiver& receiver,
      const std::optional<RestoreOptions>& options) {
    RETURN_IF_ERROR(TakeDeferredError());
    const RestoreOptions& chosen = options.value_or(options_.restore);
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
        return RestoreCheckpoint(storage, dir, targets, *pool_, chosen,
                                 receiver);
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
    return stats;
  }

  absl::StatusOr<Manifest> ReadManifest(int64_t step) const {
    return root_->ReadManifest(step);
  }

  absl::StatusOr<VerifyReport> Verify(int64_t step) const {
    return root_->Verify(step);
  }

  absl::Status Delete(int64_t step) {
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

  const std::string& root() const { return root_->path(); }
  int64_t host_memory_budget() const { return host_memory_budget_; }

 private:
  // kNotFound for a restore that neither tier can serve.
  absl::Status NoStepInEitherTier(std::optional<int64_t> step,
                                  const std::string& note) const {
    return absl::NotFoundError(absl::StrFormat(
        "%s and the local tier hold no step to restore%s (%s)", root(),
        step ? absl::StrFormat(" numbered %d", *step) : "", note));
  }

  // The newest committed durable step; kNotFound when there is none.
  absl::StatusOr<int64_t> NewestDurable() const {
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, List());
    if (steps.empty()) {
      return absl::NotFoundError(
          absl::StrFormat("%s holds no committed step", root()));
    }
    return steps.back();
  }

  absl::StatusOr<RestoreStats> RestoreDurable(
      int64_t step,
      const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
          restore) {
    ASSIGN_OR_RETURN(const std::string dir, root_->StepDir(step));
    return restore(dir);
  }

  // Dispatches `job`'s first wave on this (the caller's) thread, for the
  // saver to finish; when that was every copy, the job is dispatched now.
  // The caller returns without waiting for the saver thread to wake, which
  // on cores busy with the copies themselves (the host backend) or with
  // training took milliseconds. Only while the saver is idle (nothing in
  // flight): the engine and the pool serve one save at a time. A share
  // Begin refuses is left to the saver, whose staging reports the error.
  void DispatchHere(Job& job) {
    if (job.planned.layout == nullptr) return;
    absl::StatusOr<std::unique_ptr<BegunSave>> begun =
        BeginSave(*job.planned.plan, job.planned.layout, engine_,
                  backend_.devices(), *job.planned.sources, job.planned.stable);
    if (!begun.ok()) return;
    job.begun = *std::move(begun);
    if (job.begun->all_dispatched()) {
      job.dispatched_after = absl::Now() - job.start;
      job.dispatch_reported = true;
      job.dispatched.Set(FenceCopies());
    }
  }

  // Whether `job` copies its frozen arrays (CheckpointManagerOptions::
  // frozen): not when the last step this manager committed holds them
  // from the same plan (every slice of it, hashed), unless this save is
  // one that checks them.
  void ChooseFrozen(Job& job) {
    if (job.tier != Tier::kDurable || !job.deltas ||
        job.planned.frozen == nullptr) {
      return;
    }
    MutexLock lock(&mu_);
    if (frozen_ready_ != job.planned.plan || last_manifest_ == nullptr ||
        job.planned.unfrozen_layout == nullptr) {
      return;
    }
    if (options_.frozen_check_every > 0 &&
        ++frozen_saves_ % options_.frozen_check_every == 0) {
      return;  // copied and checked against the base
    }
    job.frozen_base = last_manifest_->step();
    job.planned.SkipFrozen();
  }

  // A handle whose every wait returns at once: the save was skipped.
  static SaveHandle SkippedHandle(int64_t step) {
    Promise<CopyFences> dispatched;
    Promise<> staged;
    Promise<SaveInfo> committed;
    dispatched.Set(CopyFences{});
    staged.Set(absl::OkStatus());
    SaveInfo info;
    info.step = step;
    info.skipped = true;
    committed.Set(std::move(info));
    return SaveHandle(step, dispatched.future(), staged.future(),
                      committed.future(), std::make_shared<SaveProgress>(),
                      /*skipped=*/true);
  }

  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(in_flight_steps_.size()) <
           std::max(1, options_.max_in_flight);
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_steps_.empty();
  }
  // Returns once no save is in flight (the saver then leaves the
  // coordinator to the caller's collectives).
  void AwaitIdle() {
    MutexLock lock(&mu_);
    mu_.Await(Condition(this, &Impl::Idle));
  }
  bool HasJobOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Status TakeDeferredError() {
    MutexLock lock(&mu_);
    return std::exchange(deferred_error_, absl::OkStatus());
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
      RETURN_IF_ERROR(root_->Delete(step));
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
      if (info.ok() && job->tier == Tier::kDurable) {
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
        if (info.ok()) {
          last_committed_step_ = job->step;
          last_committed_ = absl::Now();
        }
        in_flight_steps_.erase(job->step);
      }
      job->committed.Set(std::move(info));
    }
  }

  absl::StatusOr<SaveInfo> Run(Job& job) {
    SaveRequest request;
    request.root = root();
    request.step = job.step;
    request.arrays = *job.planned.specs;
    request.plan = job.planned.plan.get();
    request.layout = job.planned.layout;
    request.stable = job.planned.stable;
    request.metadata_json = job.metadata_json;
    request.deltas = job.deltas;
    request.per_rank_json = job.per_rank_json;
    // Frozen arrays are checked or referenced by durable delta saves only.
    if (job.tier == Tier::kDurable && job.deltas) {
      request.frozen = job.planned.frozen;
    }
    request.frozen_skipped = job.frozen_base >= 0;
    request.frozen_base = job.frozen_base;
    {
      MutexLock lock(&mu_);
      request.base_hint = last_manifest_;
    }
    request.tracer = options_.tracer;
    request.progress = job.progress.get();
    request.writer_thread_setup = [this] { LowerPriority(); };
    request.on_dispatched = [this, &job](const absl::Status& status) {
      if (std::exchange(job.dispatch_reported, true)) return;  // DispatchHere
      job.dispatched_after = absl::Now() - job.start;
      if (status.ok()) {
        job.dispatched.Set(FenceCopies());
      } else {
        job.dispatched.Set(status);
      }
    };
    request.on_staged = [&job](const absl::Status& status) {
      job.staged_after = absl::Now() - job.start;
      job.staged.Set(status);
    };
    const bool local = job.tier == Tier::kLocal;
    if (local) {
      request.root = local_->root();
      request.overwrite = true;
      request.part = ManifestPart{coordinator_.rank(), coordinator_.size()};
    }
    absl::StatusOr<SaveResult> result = SaveCheckpoint(
        local ? local_->own().storage() : storage_,
        local ? *alone_ : coordinator_, request, engine_, backend_.devices(),
        *job.planned.sources, std::move(job.begun));
    int64_t replicated_bytes = 0;
    if (local) {
      // Every rank replicates, or removes its part when a rank failed.
      absl::Status replicated =
          local_->Replicate(job.step, result.status(), &replicated_bytes);
      if (result.ok() && !replicated.ok()) return replicated;
    }
    if (!result.ok()) return result.status();
    if (!local) {
      MutexLock lock(&mu_);
      last_manifest_ = result->manifest;
      frozen_ready_ = job.planned.plan;
    }
    SaveInfo info;
    info.step = job.step;
    info.tier = job.tier;
    info.replicated_bytes = replicated_bytes;
    info.path = result->path;
    info.bytes = result->bytes;
    info.referenced_bytes = result->referenced_bytes;
    info.dispatches = result->transfer.dispatches;
    info.waves = result->transfer.waves;
    info.overflow_bytes = result->transfer.overflow_bytes;
    info.stalled_bytes = result->transfer.stalled_bytes;
    info.blocked_reason = BlockedReason(
        result->transfer, pool_->capacity_bytes(), host_memory_budget_);
    info.dispatched = job.dispatched_after;
    info.staged = job.staged_after;
    info.committed = absl::Now() - job.start;
    return info;
  }

  // A fence after the copies dispatched so far on each local device that
  // has them (WaitStagedOn). None at all when a device fails to make one:
  // WaitStagedOn then waits on the CPU, which is slower but as safe, and
  // the save goes on (its copies are already in flight).
  CopyFences FenceCopies() {
    CopyFences fences;
    for (Device* device : backend_.devices()) {
      absl::StatusOr<std::shared_ptr<const CopyFence>> fence =
          device->FenceCopiesToHost();
      if (!fence.ok()) return {};
      if (*fence != nullptr) fences.push_back(*std::move(fence));
    }
    return fences;
  }

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

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    const std::string& root, Backend& backend, Coordinator& coordinator,
    const CheckpointManagerOptions& options, Storage* storage) {
  if (options.pool_bytes <= 0 || options.keep_last < 0 ||
      options.keep_every < 0 || options.max_in_flight < 1 ||
      options.frozen_check_every < 0) {
    return absl::InvalidArgumentError(
        "checkpoint manager options: pool_bytes and max_in_flight must be "
        "positive, keep_last, keep_every and frozen_check_every "
        "non-negative");
  }
  {
    SavePlanOptions plan = options.plan;  // 0 streams: the storage's number
    for (int streams :
         {options.plan.writer_streams, options.local.writer_streams}) {
      plan.writer_streams = streams == 0 ? 1 : streams;
      if (absl::Status valid = ValidateSavePlanOptions(plan); !valid.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint manager options: plan: ", valid.message()));
      }
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
  // The root's storage, and the local filesystem for the local tier: the
  // same one unless the root's is not local (an object store).
  std::vector<std::unique_ptr<Storage>> owned;
  Storage* local_storage = storage;
  if (storage == nullptr) {
    ASSIGN_OR_RETURN(owned.emplace_back(),
                     OpenStorage(root, options.storage()));
    storage = local_storage = owned.back().get();
  }
  if (!storage->capabilities().local && !options.local.root.empty()) {
    ASSIGN_OR_RETURN(owned.emplace_back(), OpenLocalStorage(options.storage()));
    local_storage = owned.back().get();
  }
  // One lock per job: rank 0 opens the root (creating it, taking its lock
  // and recovering it), then tells the others, who open it for reading and
  // check that they see its lock (the same filesystem).
  std::unique_ptr<CheckpointRoot> opened_root;
  absl::Status opened;
  if (coordinator.rank() == 0) {
    absl::StatusOr<std::unique_ptr<CheckpointRoot>> r =
        CheckpointRoot::Open(root, storage);
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
                     CheckpointRoot::OpenForReading(root, storage));
    RETURN_IF_ERROR(opened_root->CheckLockHolder(token));
  }
  ASSIGN_OR_RETURN(Topology topology, GatherTopology(backend, coordinator));
  ASSIGN_OR_RETURN(Topology part_topology,
                   PartTopology(topology, coordinator.rank()));
  std::unique_ptr<LocalTier> local;
  if (!options.local.root.empty()) {
    ASSIGN_OR_RETURN(
        local,
        LocalTier::Open(options.local.root, options.local.replicas,
                        options.local.keep_last, coordinator, *local_storage));
  }
  // The pool is pinned now unless a restore may come first: a root without
  // a committed step has nothing to restore (see PoolPinning).
  bool pin_now =
      options.pool_pinning == CheckpointManagerOptions::PoolPinning::kAtOpen;
  if (!pin_now) {
    absl::StatusOr<std::vector<int64_t>> steps = opened_root->List();
    pin_now = !steps.ok() || steps->empty();
    if (local != nullptr && pin_now) {
      steps = local->own().List();
      pin_now = !steps.ok() || steps->empty();
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StagingPool> pool,
                   pin_now ? StagingPool::Create(backend, options.pool_bytes)
                           : StagingPool::CreatePending(options.pool_bytes));
  ASSIGN_OR_RETURN(const int64_t host_memory_budget,
                   HostMemoryBudgetBytes(options.host_memory_budget,
                                         options.pool_bytes, coordinator));
  // Writer streams 0: the storage's choice, the root's for durable saves
  // and the local filesystem's for the local tier's parts.
  CheckpointManagerOptions resolved = options;
  if (resolved.local.writer_streams == 0) {
    resolved.local.writer_streams =
        options.plan.writer_streams != 0
            ? options.plan.writer_streams
            : local_storage->preferred_writer_streams();
  }
  if (resolved.plan.writer_streams == 0) {
    resolved.plan.writer_streams = storage->preferred_writer_streams();
  }
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::make_unique<Impl>(
          std::move(opened_root), backend, coordinator, resolved,
          std::move(owned), std::move(topology), std::move(part_topology),
          std::move(local), std::move(pool), pin_now, host_memory_budget)));
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
absl::StatusOr<VerifyReport> CheckpointManager::Verify(int64_t step) const {
  return impl_->Verify(step);
}
absl::StatusOr<Manifest> CheckpointManager::ReadManifest(int64_t step) const {
  return impl_->ReadManifest(step);
}
absl::Status CheckpointManager::Delete(int64_t step) {
  return impl_->Delete(step);
}
const std::string& CheckpointManager::root() const { return impl_->root(); }

}  // namespace hoist
