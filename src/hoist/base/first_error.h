// FirstError: the first non-OK status reported by any of several threads.
#ifndef HOIST_BASE_FIRST_ERROR_H_
#define HOIST_BASE_FIRST_ERROR_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "hoist/mutex.h"

namespace hoist {

// Thread-safe. Later errors are dropped; OK statuses are ignored.
class FirstError {
 public:
  void Record(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  absl::Status Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_BASE_FIRST_ERROR_H_
