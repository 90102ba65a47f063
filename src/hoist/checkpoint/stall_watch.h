// StallWatch: warns when the save under way has moved no bytes for a while
// (CheckpointManagerOptions::stall_warn), naming its phase, the rank and the
// file or object it last wrote; or the restore under way, naming the file
// or object it reads. It only warns: the operation goes on, and the
// timeouts that fail it still do.
#ifndef HOIST_CHECKPOINT_STALL_WATCH_H_
#define HOIST_CHECKPOINT_STALL_WATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "hoist/checkpoint_types.h"
#include "hoist/mutex.h"

namespace hoist {

using Warn = std::function<void(const std::string&)>;

// Hands `message` to `warn`, or writes it to stderr when `warn` is null.
void EmitWarning(const Warn& warn, const std::string& message);

// The stall decision, apart from the thread and the clock: fed a save's
// samples (its step, bytes moved, phase, and when each was taken), it says
// when one has stalled for `after`, once per stall.
class StallClock {
 public:
  explicit StallClock(absl::Duration after) : after_(after) {}
  // True when this sample shows the save stalled for `after` and it was
  // not said already; a new step, or bytes or a phase that moved, start
  // the clock again.
  bool Stalled(int64_t step, int64_t bytes, const char* phase, absl::Time now);
  // How long the save has not moved, at `now`.
  absl::Duration StalledFor(absl::Time now) const { return now - moved_; }
  // No save under way: the next sample starts afresh.
  void Reset() { step_ = -1; }

 private:
  const absl::Duration after_;
  int64_t step_ = -1;
  int64_t bytes_ = -1;
  const char* phase_ = nullptr;
  absl::Time moved_;  // when its bytes or phase last changed
  bool warned_ = false;
};

class StallWatch {
 public:
  // `after` <= 0: never warns (no thread). `warn` null: to stderr.
  StallWatch(absl::Duration after, int rank, Warn warn);
  ~StallWatch();  // stops the thread
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Watches step `step`'s save until Unwatch (one save at a time: the one
  // the saver runs). A stall is warned about once; bytes that move again
  // end it.
  void Watch(int64_t step, std::shared_ptr<const SaveProgress> progress)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Watches a restore of `step` (-1: the newest step) until Unwatch, its
  // bytes read counted in `progress` (done; current: the file or object it
  // reads). One operation at a time: a manager keeps a watch for each.
  void WatchRestore(int64_t step,
                    std::shared_ptr<const OperationProgress> progress)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unwatch() ABSL_LOCKS_EXCLUDED(mu_);

  // The warning for a save of `step` stalled for `stalled`.
  static std::string Message(int64_t step, int rank, absl::Duration stalled,
                             const SaveProgress& progress);
  // The warning for a restore of `step` (-1: the newest) stalled for
  // `stalled`.
  static std::string RestoreMessage(int64_t step, int rank,
                                    absl::Duration stalled,
                                    const OperationProgress& progress);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // The warning due now ("" if none).
  std::string Check(StallClock& clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }

  const absl::Duration after_;
  const int rank_;
  const Warn warn_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<const SaveProgress> progress_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const OperationProgress> restore_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_STALL_WATCH_H_
