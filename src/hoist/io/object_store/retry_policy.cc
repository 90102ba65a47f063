#include "hoist/io/object_store/retry_policy.h"

#include <algorithm>

namespace hoist {

RetryPolicy::RetryPolicy(RetryOptions options, std::function<absl::Time()> now,
                         uint64_t seed)
    : options_(options),
      now_(std::move(now)),
      tokens_(options.budget),
      refilled_(now_()),
      random_(seed) {}

bool RetryPolicy::ShouldRetry(bool retryable, int64_t retries) {
  if (!retryable || retries + 1 >= options_.max_attempts) return false;
  MutexLock lock(&mu_);
  const absl::Time now = now_();
  // budget / 10 retries come back each second, up to the budget.
  tokens_ = std::min<double>(
      options_.budget,
      tokens_ + absl::ToDoubleSeconds(now - refilled_) * options_.budget / 10);
  refilled_ = now;
  if (tokens_ < 1) {
    refused_.fetch_add(1);
    return false;
  }
  tokens_ -= 1;
  retried_.fetch_add(1);
  return true;
}

absl::Duration RetryPolicy::Delay(int64_t retries) {
  const absl::Duration ceiling = std::min(
      options_.max_delay,
      options_.base_delay *
          (int64_t{1} << std::min<int64_t>(std::max<int64_t>(retries, 0), 30)));
  MutexLock lock(&mu_);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  return ceiling * unit(random_);
}

}  // namespace hoist
