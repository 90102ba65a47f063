// PreemptionWatch: how the ranks of a job agree on the step at which they
// all save before a preemption (CheckpointManagerOptions::preemption).
//
// A rank learns of the preemption from a signal (SignalNotice: the handler
// only counts it), from Notice(), or from another rank's post on the
// coordinator's notice board. The watch's thread polls for all three, and
// the first time it learns of one it posts this rank's last step: the
// highest step for which Reached() answered false. Once every rank has
// posted, the agreed step is the highest posted plus one, and Reached(step)
// is true for it and every later step, on every rank alike: no rank has
// answered false for a step at or past it, because from its post on a
// rank's Reached() waits for the agreement before it answers a new step.
// Before any notice, Reached() only takes a mutex: no collective, no
// request, on the training thread.
//
// Thread-safety: Reached from one thread (the training loop's); Notice and
// the accessors from any.
#ifndef HOIST_CHECKPOINT_PREEMPTION_H_
#define HOIST_CHECKPOINT_PREEMPTION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hoist/base/signal_notice.h"
#include "hoist/checkpoint/stall_watch.h"
#include "hoist/coordinator.h"
#include "hoist/mutex.h"

namespace hoist {

class PreemptionWatch {
 public:
  struct Options {
    std::vector<int> signals;  // may be empty: Notice() and other ranks only
    // How often the thread looks for a signal and at the board.
    absl::Duration poll = absl::Seconds(1);
    // How long Reached() waits for every rank's post once it has posted.
    absl::Duration agree_timeout = absl::Minutes(10);
    // The board's name: the same on every rank, unique per manager.
    std::string board = "preemption";
  };

  // Installs the signal handlers and starts the thread. Errors: the
  // signals' (kInvalidArgument); the board's, read once here so that a
  // coordinator without one fails now (kUnimplemented, or the MPI
  // coordinator's kFailedPrecondition below MPI_THREAD_MULTIPLE). `warn`
  // hears of a handler the job replaced (null: stderr). `coordinator`
  // must outlive the watch.
  static absl::StatusOr<std::unique_ptr<PreemptionWatch>> Start(
      Coordinator& coordinator, Options options, Warn warn);
  ~PreemptionWatch();  // stops the thread; removes the handlers

  // Whether `step` is at or past the job's preemption step (see the top).
  // Steps must not decrease from call to call. Once this rank has learned
  // of a preemption, a step past those answered waits for every rank's
  // post: kDeadlineExceeded naming the ranks missing after agree_timeout;
  // the board's error as is.
  absl::StatusOr<bool> Reached(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // This rank learned of a preemption by other means (a scheduler's API).
  void Notice() ABSL_LOCKS_EXCLUDED(mu_);

  // The agreed step, once every rank has posted.
  std::optional<int64_t> agreed_step() const ABSL_LOCKS_EXCLUDED(mu_);
  // When this rank learned of the preemption (InfiniteFuture before).
  absl::Time noticed_at() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  PreemptionWatch(Coordinator& coordinator, Options options, Warn warn,
                  std::unique_ptr<SignalNotice> signals);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // One look at the signals and the board; true once the watch is done
  // (agreed, or failed).
  bool Look() ABSL_LOCKS_EXCLUDED(mu_);
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (noticed_ && !posted_self_);
  }
  // This rank learned of the preemption now: its last step is its post.
  void NoticeNow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return agreed_.has_value() || !error_.ok();
  }

  Coordinator& coordinator_;
  const Options options_;
  const Warn warn_;
  const std::unique_ptr<SignalNotice> signals_;  // null without signals
  const int64_t signals_at_start_;
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The highest step Reached() answered (false), INT64_MIN before any.
  int64_t last_step_ ABSL_GUARDED_BY(mu_) = INT64_MIN;
  // This rank learned of the preemption: what it posts (its last step,
  // "" before any), and whether that post is made.
  bool noticed_ ABSL_GUARDED_BY(mu_) = false;
  std::string post_ ABSL_GUARDED_BY(mu_);
  bool posted_self_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time noticed_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int posted_ ABSL_GUARDED_BY(mu_) = 0;  // ranks seen on the board
  std::optional<int64_t> agreed_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_PREEMPTION_H_
