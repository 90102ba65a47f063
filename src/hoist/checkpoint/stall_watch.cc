// StallWatch: one thread that samples the watched save's byte counts.
#include "hoist/checkpoint/stall_watch.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/thread_priority.h"

namespace hoist {

void EmitWarning(const Warn& warn, const std::string& message) {
  if (warn) {
    warn(message);
  } else {
    std::fprintf(stderr, "%s\n", message.c_str());
  }
}

StallWatch::StallWatch(absl::Duration after, int rank, Warn warn)
    : after_(after), rank_(rank), warn_(std::move(warn)) {
  if (after_ <= absl::ZeroDuration()) return;
  thread_ = std::thread([this] {
    NameThisThread("hoist-stallwatch");
    Run();
  });
}

StallWatch::~StallWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StallWatch::Watch(int64_t step,
                       std::shared_ptr<const SaveProgress> progress) {
  MutexLock lock(&mu_);
  step_ = step;
  progress_ = std::move(progress);
}

void StallWatch::WatchRestore(
    int64_t step, std::shared_ptr<const OperationProgress> progress) {
  MutexLock lock(&mu_);
  step_ = step;
  progress_ = nullptr;
  restore_ = std::move(progress);
}

void StallWatch::Unwatch() {
  MutexLock lock(&mu_);
  step_ = -1;
  progress_ = nullptr;
  restore_ = nullptr;
}

std::string StallWatch::Message(int64_t step, int rank, absl::Duration stalled,
                                const SaveProgress& progress) {
  const std::string writing = progress.writing.Get();
  return absl::StrFormat(
      "hoist: warning: the save of step %d on rank %d has moved no bytes for "
      "%s, in phase %s (%s); it goes on",
      step, rank, absl::FormatDuration(absl::Trunc(stalled, absl::Seconds(1))),
      progress.phase.load(),
      writing.empty() ? std::string("no file or object written yet")
                      : "last written: " + writing);
}

std::string StallWatch::RestoreMessage(int64_t step, int rank,
                                       absl::Duration stalled,
                                       const OperationProgress& progress) {
  const std::string reading = progress.current.Get();
  return absl::StrFormat(
      "hoist: warning: the restore of %s on rank %d has read no bytes for "
      "%s (%s); it goes on",
      step < 0 ? std::string("the newest step")
               : absl::StrFormat("step %d", step),
      rank, absl::FormatDuration(absl::Trunc(stalled, absl::Seconds(1))),
      reading.empty() ? std::string("reading its manifest, no data file yet")
                      : "reading " + reading);
}

bool StallClock::Stalled(int64_t step, int64_t bytes, const char* phase,
                         absl::Time now) {
  if (step != step_ || bytes != bytes_ || phase != phase_) {
    // A new save, or bytes (or the phase) moved: the clock restarts.
    step_ = step;
    bytes_ = bytes;
    phase_ = phase;
    moved_ = now;
    warned_ = false;
    return false;
  }
  if (warned_ || now - moved_ < after_) return false;
  warned_ = true;
  return true;
}

void StallWatch::Run() {
  // Sampled a few times per `after_`: a stall is seen within a quarter of
  // it (at most a second) of its length.
  const absl::Duration poll = std::min(after_ / 4, absl::Seconds(1));
  StallClock clock(after_);
  while (true) {
    std::string message;
    {
      MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(Condition(this, &StallWatch::Stopping), poll)) {
        return;
      }
      message = Check(clock);
    }
    if (!message.empty()) EmitWarning(warn_, message);
  }
}

std::string StallWatch::Check(StallClock& clock) {
  const absl::Time now = absl::Now();
  if (restore_ != nullptr) {
    if (!clock.Stalled(step_, restore_->done.load(), "restore", now)) {
      return "";
    }
    return RestoreMessage(step_, rank_, clock.StalledFor(now), *restore_);
  }
  if (progress_ == nullptr) {
    clock.Reset();
    return "";
  }
  if (!clock.Stalled(
          step_,
          progress_->staged_bytes.load() + progress_->written_bytes.load(),
          progress_->phase.load(), now)) {
    return "";
  }
  return Message(step_, rank_, clock.StalledFor(now), *progress_);
}

}  // namespace hoist
