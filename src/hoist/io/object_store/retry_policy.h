// RetryPolicy: which failed object-store requests are sent again, and
// after how long (docs/robustness.md). A request the store may answer
// differently next time (throttling: S3's 503 SlowDown; a reset
// connection, a timeout, a 5xx) is retried up to max_attempts in all,
// after a pause drawn uniformly from [0, min(max_delay, base_delay *
// 2^retries)] ("full jitter": ranks throttled together do not come back
// together). Retries draw on a budget shared by every request of the
// storage (a token bucket of `budget` retries, refilled at budget / 10 a
// second), so a store that fails everything stops being retried after
// about `budget` retries and the save fails fast instead of multiplying
// its requests. Thread-safe.
#ifndef HOIST_IO_OBJECT_STORE_RETRY_POLICY_H_
#define HOIST_IO_OBJECT_STORE_RETRY_POLICY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>

#include "absl/time/time.h"
#include "hoist/mutex.h"

namespace hoist {

struct RetryOptions {
  int max_attempts = 4;  // per request, the first included
  absl::Duration base_delay = absl::Milliseconds(200);
  absl::Duration max_delay = absl::Seconds(5);
  int budget = 100;  // retries in the bucket when full
};

class RetryPolicy {
 public:
  // `now` is the clock (tests give their own); `seed` the jitter's.
  explicit RetryPolicy(RetryOptions options,
                       std::function<absl::Time()> now = absl::Now,
                       uint64_t seed = std::random_device{}());

  // Whether a request that failed after `retries` retries is sent again:
  // only a `retryable` error, within max_attempts, when the budget has a
  // retry left (which this takes).
  bool ShouldRetry(bool retryable, int64_t retries) ABSL_LOCKS_EXCLUDED(mu_);
  // The pause before retry number `retries` + 1.
  absl::Duration Delay(int64_t retries) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t retried() const { return retried_.load(); }
  // Retries refused because the budget was spent.
  int64_t refused() const { return refused_.load(); }
  const RetryOptions& options() const { return options_; }

 private:
  const RetryOptions options_;
  const std::function<absl::Time()> now_;
  Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> retried_{0};
  std::atomic<int64_t> refused_{0};
};

}  // namespace hoist

#endif  // HOIST_IO_OBJECT_STORE_RETRY_POLICY_H_
