// The demo's training: the loop that changes the state and saves it in
// both modes, its status line, and the prediction it is compared with.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string_view>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/box.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/cuda_backend.h"
#include "hoist/host_backend.h"
#include "hoist/model/mesh_flag.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "hoist/mutex.h"
#include "hoist/predict.h"
#include "hoist/tools/command_error.h"
#include "hoist/tools/demo_job.h"

namespace hoist::demo {
namespace {

// A status line redrawn every 100 ms on a terminal, showing the newest save:
// bytes staged and written, rate and ETA. Owns its drawing thread; draws
// nothing when disabled (stdout is not a terminal, or --json).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) {
    if (enabled) thread_ = std::thread([this] { Run(); });
  }
  ~ProgressLine() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void Track(const SaveHandle& handle) {
    MutexLock lock(&mu_);
    handle_ = handle;
  }

 private:
  bool Stopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; }

  void Run() {
    MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(Condition(this, &ProgressLine::Stopped),
                                 absl::Milliseconds(100))) {
      if (!handle_) continue;
      const SaveProgress& p = handle_->progress();
      const double total =
          static_cast<double>(std::max<int64_t>(1, p.total_bytes));
      const double staged = static_cast<double>(p.staged_bytes.load());
      const double written = static_cast<double>(p.written_bytes.load());
      const double elapsed = absl::ToDoubleSeconds(absl::Now() - p.start);
      const double rate = elapsed > 0 ? written / elapsed : 0;
      constexpr int kWidth = 24;
      const int done = static_cast<int>(kWidth * written / total);
      std::string bar(done, '#');
      bar.resize(kWidth, '-');
      const bool finished = handle_->status().ok() || written >= total;
      std::cout << absl::StrFormat(
                       "\r\033[Kstep %d [%s] staged %s, written %s of %s, "
                       "%.2f GB/s%s",
                       handle_->step(), bar, FormatBytes(staged),
                       FormatBytes(written), FormatBytes(total), rate / 1e9,
                       finished
                           ? ", committing"
                           : absl::StrFormat(
                                 ", ETA %.1fs",
                                 rate > 0 ? (total - written) / rate : 0.0))
                << std::flush;
    }
    if (handle_) std::cout << "\r\033[K" << std::flush;
  }

  Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<SaveHandle> handle_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Copies every part's host bytes to its replicas: one dispatch per device.

}  // namespace

absl::StatusOr<Predicted> Predict(const DemoFlags& flags, const DemoJob& job,
                                  int64_t pool, int64_t budget,
                                  const SavePlanOptions& plan_options) {
  Predicted out;
  // The rates measured are a local disk's: no prediction for a root that
  // is not on one (an object store).
  if (!flags.predict || !job.storage->capabilities().local) return out;
  out.on = true;
  std::string measured;
  if (job.lead) {
    // Beside the root, which the manager creates (and pins its pool) later,
    // with its parents: those first, as the manager would.
    std::string dir = std::filesystem::path(job.root).parent_path().string();
    if (dir.empty()) dir = ".";
    std::error_code made;
    std::filesystem::create_directories(dir, made);
    if (made) {
      return absl::FailedPreconditionError(
          absl::StrFormat("--root %s: cannot create its parent %s: %s",
                          job.root, dir, made.message()));
    }
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(SaveRates rates,
                     MeasureSaveRates(*job.backend, *job.storage, dir,
                                      {.bytes = std::clamp<int64_t>(
                                           job.model_bytes, int64_t{32} << 20,
                                           int64_t{256} << 20),
                                       .writer_streams = flags.writers}));
    out.measure_s = absl::ToDoubleSeconds(absl::Now() - start);
    measured =
        absl::StrFormat("%a,%a,%a,%a,%a", rates.d2h_gbps, rates.host_gbps,
                        rates.write_gbps, rates.commit_s, out.measure_s);
  }
  ASSIGN_OR_RETURN(measured, job.coordinator->Broadcast("rates", measured, 0));
  std::vector<std::string> fields = absl::StrSplit(measured, ',');
  double* values[] = {&out.rates.d2h_gbps, &out.rates.host_gbps,
                      &out.rates.write_gbps, &out.rates.commit_s,
                      &out.measure_s};
  if (fields.size() != std::size(values)) {
    return absl::InternalError("the lead's rates did not arrive whole");
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    *values[i] = std::strtod(fields[i].c_str(), nullptr);
  }
  // Every process writes to the one root: the lead's rate, measured alone,
  // is taken as the job's limit too.
  if (job.processes > 1) out.rates.fs_gbps = out.rates.write_gbps;
  const Topology topology = Topology::Uniform(
      job.processes, static_cast<int>(job.backend->devices().size()));
  ASSIGN_OR_RETURN(SavePlan plan,
                   MakeSavePlan(job.model, topology, plan_options));
  ASSIGN_OR_RETURN(out.save,
                   PredictSave(plan, topology, pool, out.rates, budget));
  return out;
}

// The saves of `trained` as the model sees them: the manager's saver runs
// saves one after another, so a save asked for before the previous one has
// committed starts (and, in either mode, returns) only then.
void Schedule(const Trained& trained, Predicted& predicted) {
  if (!predicted.on || trained.requested_at.empty()) return;
  double committed = 0, blocked = 0, saved = 0, queued = 0;
  int staged = 0;
  for (size_t k = 0; k < trained.requested_at.size(); ++k) {
    const double asked = trained.requested_at[k];
    const double start = std::max(asked, committed);
    committed = start + predicted.save.save_s;
    queued += start - asked;
    saved += committed - asked;
    if (trained.mode[k] == 0) {
      blocked += start - asked + predicted.save.blocked_s;
      ++staged;
    }
  }
  const double n = static_cast<double>(trained.requested_at.size());
  predicted.blocked_s = blocked / std::max(1, staged);
  predicted.save_s = saved / n;
  predicted.queued_s = queued / n;
}

// 2. Train: every step changes every array; every --save-every steps a save,
// alternating staged and dispatched mode; then the table of saves.
absl::StatusOr<Trained> Train(const DemoFlags& flags, absl::Duration step_time,
                              DemoJob& job, CheckpointManager& manager,
                              bool print) {
  // The devices computing: the host has nothing to do until they finish.
  const auto compute = [step_time] {
    Notification never;
    (void)never.WaitForNotificationWithTimeout(step_time);
  };
  // The device buffers stay where SetUp allocated them: registered once,
  // each save reads none of them (--arrays given: every save is handed
  // every array, as a job whose arrays move must).
  std::optional<RegisteredArrays> registered;
  if (flags.arrays == "registered") {
    ASSIGN_OR_RETURN(registered, manager.Register(job.arrays));
  }
  Trained trained;
  std::optional<ProgressLine> progress;
  progress.emplace(print && !flags.quiet && isatty(STDOUT_FILENO) != 0);
  std::vector<SaveHandle> handles;
  std::vector<int> handle_mode;
  std::vector<double> handle_blocked;
  const absl::Time began = absl::Now();
  for (int step = 1; step <= flags.steps; ++step) {
    // The optimizer step: new values, on every replica.
    for (auto& array : job.parts) {
      for (Part& part : array) {
        Mutate(part.host.data(), static_cast<int64_t>(part.host.size()),
               part.seed, step);
      }
    }
    RETURN_IF_ERROR(Upload(job.parts));
    if (step % flags.save_every != 0) {
      compute();
      continue;
    }
    const int mode = static_cast<int>(handles.size() % 2);
    const absl::Time start = absl::Now();
    trained.mode.push_back(mode);
    trained.requested_at.push_back(absl::ToDoubleSeconds(start - began));
    const ReturnWhen when =
        mode == 0 ? ReturnWhen::kStaged : ReturnWhen::kDispatched;
    std::string metadata = absl::StrFormat(R"({"step": %d})", step);
    ASSIGN_OR_RETURN(
        SaveHandle handle,
        registered ? manager.Save(step, *registered, std::move(metadata), when)
                   : manager.Save(step, job.arrays, std::move(metadata), when));
    double blocked = absl::ToDoubleSeconds(absl::Now() - start);
    // Forward and backward run while the copies proceed (dispatched mode)
    // or after them (staged mode)...
    compute();
    if (mode == 1) {
      // ...and the optimizer step waits for staging before it changes them.
      const absl::Time wait = absl::Now();
      RETURN_IF_ERROR(handle.WaitStaged());
      blocked += absl::ToDoubleSeconds(absl::Now() - wait);
    }
    progress->Track(handle);
    handles.push_back(handle);
    handle_mode.push_back(mode);
    handle_blocked.push_back(blocked);
    trained.last_saved = step;
  }
  RETURN_IF_ERROR(manager.WaitUntilFinished());
  progress.reset();  // the status line goes before the table
  // Each process knows the bytes it wrote and sent to its replica holders;
  // the job's are their sums.
  std::string mine;
  std::string blocked_reason;  // the first save's that waited for storage
  for (SaveHandle& handle : handles) {
    ASSIGN_OR_RETURN(SaveInfo info, handle.WaitCommitted());
    absl::StrAppend(&mine, info.bytes, ",", info.replicated_bytes, ",");
    if (blocked_reason.empty()) blocked_reason = info.blocked_reason;
  }
  if (!blocked_reason.empty() && !flags.json) {
    std::cerr << absl::StrFormat("hoist demo: rank %d: %s\n", job.rank,
                                 blocked_reason);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> theirs,
                   job.coordinator->AllGather("bytes", mine));
  std::vector<int64_t> job_bytes(2 * handles.size(), 0);
  for (const std::string& list : theirs) {
    size_t i = 0;
    for (absl::string_view b : absl::StrSplit(list, ',', absl::SkipEmpty())) {
      int64_t v = 0;
      if (i < job_bytes.size() && absl::SimpleAtoi(b, &v)) job_bytes[i] += v;
      ++i;
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    ASSIGN_OR_RETURN(SaveInfo info, handles[i].WaitCommitted());
    info.bytes = job_bytes[2 * i];
    info.replicated_bytes = job_bytes[2 * i + 1];
    for (ModeStats* m : {&trained.modes[handle_mode[i]],
                         &trained.tiers[static_cast<int>(info.tier)]}) {
      ++m->saves;
      m->blocked.push_back(handle_blocked[i]);
      m->dispatch_s += absl::ToDoubleSeconds(info.dispatched);
      m->staged_s += absl::ToDoubleSeconds(info.staged);
      m->committed_s += absl::ToDoubleSeconds(info.committed);
      m->bytes = info.bytes;
      m->dispatches = info.dispatches;
      m->replicated_bytes = info.replicated_bytes;
    }
    if (print) {
      std::cout << absl::StrFormat(
          "%5d %-11s %10.3fs %10.3fs %10.3fs %9.2f %11d%s\n", info.step,
          handle_mode[i] == 0 ? "staged" : "dispatched", handle_blocked[i],
          absl::ToDoubleSeconds(info.staged),
          absl::ToDoubleSeconds(info.committed),
          info.bytes / 1e9 / absl::ToDoubleSeconds(info.committed),
          info.dispatches,
          flags.local_root.empty() ? ""
                                   : "  " + std::string(TierName(info.tier)));
    }
  }
  return trained;
}

// A restore target for `spec`: this process's devices' shards of it, each
// in device memory allocated for it (kept in `memory`).

}  // namespace hoist::demo
