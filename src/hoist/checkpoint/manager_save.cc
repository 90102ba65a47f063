// The manager's saves: Save() plans on the caller's thread, dispatches the
// first wave there when the saver is idle, and queues the job; the saver
// thread stages, persists and commits it (save/save.cc), then applies
// retention.
#include "hoist/checkpoint/manager_impl.h"
#include "hoist/checkpoint/save/written.h"

namespace hoist {

absl::StatusOr<SaveHandle> CheckpointManager::Impl::Save(
    int64_t step, absl::Span<const SaveArray> arrays, std::string metadata_json,
    ReturnWhen return_when, const SaveOptions& save_options) {
  return SaveWith(step, std::move(metadata_json), return_when, save_options,
                  [&](Job& job) -> absl::Status {
                    ASSIGN_OR_RETURN(job.planned,
                                     planner_.PlanFor(arrays, job.tier));
                    return absl::OkStatus();
                  });
}

absl::StatusOr<SaveHandle> CheckpointManager::Impl::Save(
    int64_t step, const RegisteredArrays& registered, std::string metadata_json,
    ReturnWhen return_when, const SaveOptions& save_options) {
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
                    ASSIGN_OR_RETURN(
                        job.planned,
                        planner_.PlanRegistered(*registered.state_, job.tier));
                    return absl::OkStatus();
                  });
}

absl::StatusOr<RegisteredArrays> CheckpointManager::Impl::Register(
    absl::Span<const SaveArray> arrays) {
  ASSIGN_OR_RETURN(std::shared_ptr<RegisteredArrays::State> state,
                   planner_.Register(arrays, id_));
  return RegisteredArrays(std::move(state));
}

absl::StatusOr<SaveHandle> CheckpointManager::Impl::SaveWith(
    int64_t step, std::string metadata_json, ReturnWhen return_when,
    const SaveOptions& save_options,
    absl::FunctionRef<absl::Status(Job&)> plan) {
  const absl::Time accepted = absl::Now();
  RETURN_IF_ERROR(TakeDeferredError());
  StartPinning();  // if a restore has not started it
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step %d is negative", step));
  }
  // Refused here, before the step is accepted: the saver thread must never
  // meet metadata a manifest cannot carry.
  RETURN_IF_ERROR(ValidateMetadataJson(metadata_json));
  auto job = std::make_shared<Job>();
  const std::optional<Tier> chosen = ChooseTier(step, *job);
  if (!chosen.has_value()) return SkippedHandle(step);
  const Tier tier = *chosen;
  if (options_.when_busy == CheckpointManagerOptions::WhenBusy::kSkip &&
      !job->preemption) {
    MutexLock lock(&mu_);
    if (!HasRoom()) {
      ++skipped_saves_;
      return SkippedHandle(step);
    }
  }
  job->accepted = accepted;
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
  job->planned.producer = save_options.producer;
  ChooseFrozen(*job);
  job->planned_at = absl::Now();
  job->progress->phase.store("queued");
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
                    job->committed.future(), job->progress,
                    /*skipped=*/false, tier);
  job->start = absl::Now();
  job->progress->start = job->start;
  if (saver_idle) {
    // No staging runs now: the overflow may grow for this save.
    if (job->planned.layout != nullptr) {
      // A save whose shards a producer makes holds one wave of their host
      // copies (at most a pool) beside the pool and the overflow: its
      // overflow leaves them that much of the budget.
      const int64_t pool = pool_->capacity_bytes();
      engine_.set_overflow(overflow_.Reserve(
          OverflowBytesFor(*job->planned.layout, pool),
          job->planned.producer != nullptr ? overflow_.limit_bytes() - pool
                                           : overflow_.limit_bytes()));
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

std::optional<Tier> CheckpointManager::Impl::ChooseTier(int64_t step,
                                                        Job& job) {
  // The preemption save goes where it commits fastest. Every rank agreed
  // on the step, and each sees its own save of it first.
  const std::optional<int64_t> preempt =
      preemption_ != nullptr ? preemption_->agreed_step() : std::nullopt;
  if (preempt.has_value() && step >= *preempt && !preemption_saved_) {
    preemption_saved_ = true;
    job.preemption = true;
    job.deadline = preemption_->noticed_at() + options_.preemption.deadline;
    return local_ != nullptr ? Tier::kLocal : Tier::kDurable;
  }
  // Else a deterministic function of the step, so every rank of a job
  // makes the same choice.
  if (step % options_.persist_every == 0) return Tier::kDurable;
  if (local_ != nullptr && step % options_.local.every == 0) {
    return Tier::kLocal;
  }
  return std::nullopt;
}

absl::Status CheckpointManager::Impl::NotePreemption() {
  if (preemption_ == nullptr) {
    return absl::FailedPreconditionError(
        "NotePreemption: the manager was opened without preemption signals "
        "(CheckpointManagerOptions::preemption)");
  }
  preemption_->Notice();
  return absl::OkStatus();
}

void CheckpointManager::Impl::DispatchHere(Job& job) {
  if (job.planned.layout == nullptr) return;
  job.staging_began = absl::Now();
  job.progress->phase.store("staging");
  absl::StatusOr<std::unique_ptr<BegunSave>> begun = BeginSave(
      *job.planned.plan, job.planned.layout, engine_, backend_.devices(),
      *job.planned.sources, job.planned.stable, job.planned.producer);
  if (!begun.ok()) return;
  job.begun = *std::move(begun);
  if (job.begun->all_dispatched()) {
    job.dispatched_after = absl::Now() - job.start;
    job.dispatch_reported = true;
    job.dispatched.Set(FenceCopies());
  }
}

void CheckpointManager::Impl::ChooseFrozen(Job& job) {
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

SaveHandle CheckpointManager::Impl::SkippedHandle(int64_t step) {
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

void CheckpointManager::Impl::AwaitIdle() {
  MutexLock lock(&mu_);
  mu_.Await(Condition(this, &Impl::Idle));
}

absl::Status CheckpointManager::Impl::TakeDeferredError() {
  MutexLock lock(&mu_);
  return std::exchange(deferred_error_, absl::OkStatus());
}

absl::Status CheckpointManager::Impl::ApplyRetention(int64_t newest) {
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

void CheckpointManager::Impl::SaverLoop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      MutexLock lock(&mu_);
      mu_.Await(Condition(this, &Impl::HasJobOrStopping));
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    stall_watch_.Watch(job->step, job->progress);
    absl::StatusOr<SaveInfo> info = Run(*job);
    // A preemption save leaves retention to the next run's saves.
    if (info.ok() && job->tier == Tier::kDurable && !job->preemption) {
      Retain(*job, *info);
    }
    stall_watch_.Unwatch();
    if (info.ok()) ReportSave(*job, *info);
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

void CheckpointManager::Impl::Retain(const Job& job, SaveInfo& info) {
  const absl::Time begin = absl::Now();
  absl::Status retained = ApplyRetention(job.step);
  if (!retained.ok()) {
    MutexLock lock(&mu_);
    if (deferred_error_.ok()) deferred_error_ = retained;
  }
  info.phases.push_back(
      {"retention", absl::Now() - begin, 0, coordinator_.rank()});
}

void CheckpointManager::Impl::ReportSave(const Job& job, SaveInfo& info) {
  // The last phase ends the save: it takes the moments between phases.
  info.elapsed = absl::Now() - job.accepted;
  absl::Duration phases;
  for (const PhaseStat& phase : info.phases) phases += phase.elapsed;
  if (!info.phases.empty()) info.phases.back().elapsed += info.elapsed - phases;
  ReportPhases(
      {"save", info.step, info.tier, info.elapsed, info.phases, info.slowest},
      job.accepted);
}

absl::StatusOr<SaveInfo> CheckpointManager::Impl::Run(Job& job) {
  SaveRequest request;
  request.root = root();
  request.step = job.step;
  request.arrays = *job.planned.specs;
  request.plan = job.planned.plan.get();
  request.layout = job.planned.layout;
  request.stable = job.planned.stable;
  request.metadata_json = job.metadata_json;
  request.deltas = job.deltas;
  request.manifest_encoding.split_above_extents =
      options_.split_manifest_above_extents;
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
  request.deadline = job.deadline;
  // The copies began in Save() (DispatchHere), or begin now.
  const absl::Time run_began = absl::Now();
  if (job.staging_began == absl::InfinitePast()) {
    job.staging_began = run_began;
    job.progress->phase.store("staging");
  }
  const int rank = coordinator_.rank();
  request.phases_before = {
      {"planning", job.planned_at - job.accepted, job.progress->total_bytes,
       rank},
      {"queued", job.staging_began - job.planned_at, 0, rank}};
  request.staging_began = job.staging_began;
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
  if (!local && coordinator_.size() > 1) {
    if (fingerprinted_plan_ != job.planned.plan) {
      plan_fingerprint_ = PlanFingerprint(request);
      fingerprinted_plan_ = job.planned.plan;
    }
    request.plan_fingerprint = plan_fingerprint_;
  }
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
    job.progress->phase.store("replicate");
    const absl::Time begin = absl::Now();
    absl::Status replicated =
        local_->Replicate(job.step, result.status(), &replicated_bytes);
    if (result.ok() && !replicated.ok()) return replicated;
    if (result.ok()) {
      result->phases.push_back(
          {"replicate", absl::Now() - begin, replicated_bytes, rank});
    }
  }
  if (!result.ok()) return result.status();
  job.progress->phase.store("retention");
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
  info.blocked_reason = BlockedReason(result->transfer, pool_->capacity_bytes(),
                                      host_memory_budget_);
  info.dispatched = job.dispatched_after;
  info.staged = job.staged_after;
  info.committed = absl::Now() - job.start;
  info.phases = std::move(result->phases);
  info.slowest = std::move(result->slowest);
  return info;
}

void CheckpointManager::Impl::ReportPhases(const PhaseReport& report,
                                           absl::Time began) {
  if (options_.tracer != nullptr) {
    absl::Time at = began;
    for (const PhaseStat& phase : report.phases) {
      options_.tracer->Span("phases",
                            absl::StrFormat("%s %s (step %d)", report.kind,
                                            phase.phase, report.step),
                            at, at + phase.elapsed);
      at += phase.elapsed;
    }
  }
  if (metrics_ != nullptr) {
    absl::Status appended = metrics_->Append(report);
    if (!appended.ok()) {  // a full disk: warned about, never a failed save
      EmitWarning(options_.on_warning,
                  absl::StrCat("hoist: warning: ", appended.message()));
    }
  }
  if (options_.on_phases) options_.on_phases(report);
}

CopyFences CheckpointManager::Impl::FenceCopies() {
  CopyFences fences;
  for (Device* device : backend_.devices()) {
    absl::StatusOr<std::shared_ptr<const CopyFence>> fence =
        device->FenceCopiesToHost();
    if (!fence.ok()) return {};
    if (*fence != nullptr) fences.push_back(*std::move(fence));
  }
  return fences;
}

}  // namespace hoist
