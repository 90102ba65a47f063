#include "hoist/io/object_store/retry_policy.h"

#include <gtest/gtest.h>

namespace hoist {
namespace {

// A clock the test moves.
struct Clock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> fn() {
    return [this] { return now; };
  }
};

TEST(RetryPolicyTest, RetriesARetryableErrorUpToMaxAttempts) {
  Clock clock;
  RetryPolicy policy({.max_attempts = 4}, clock.fn(), 1);
  EXPECT_TRUE(policy.ShouldRetry(true, 0));
  EXPECT_TRUE(policy.ShouldRetry(true, 1));
  EXPECT_TRUE(policy.ShouldRetry(true, 2));
  EXPECT_FALSE(policy.ShouldRetry(true, 3));  // that was the 4th attempt
  EXPECT_FALSE(policy.ShouldRetry(false, 0));
  EXPECT_EQ(policy.retried(), 3);
}

TEST(RetryPolicyTest, PausesGrowWithJitterUnderTheCap) {
  RetryPolicy policy(
      {.base_delay = absl::Milliseconds(200), .max_delay = absl::Seconds(5)},
      absl::Now, 7);
  for (int64_t retries = 0; retries < 12; ++retries) {
    const absl::Duration ceiling = std::min(
        absl::Seconds(5), absl::Milliseconds(200) * (int64_t{1} << retries));
    absl::Duration lowest = absl::InfiniteDuration(), highest;
    for (int i = 0; i < 200; ++i) {
      const absl::Duration delay = policy.Delay(retries);
      ASSERT_GE(delay, absl::ZeroDuration());
      ASSERT_LE(delay, ceiling);
      lowest = std::min(lowest, delay);
      highest = std::max(highest, delay);
    }
    // Spread over the range, not one value: 200 draws of a uniform.
    EXPECT_LT(lowest, ceiling / 4) << retries;
    EXPECT_GT(highest, ceiling * 3 / 4) << retries;
  }
}

TEST(RetryPolicyTest, ABudgetSpentRefusesRetriesUntilItRefills) {
  Clock clock;
  RetryPolicy policy({.max_attempts = 100, .budget = 10}, clock.fn(), 1);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(policy.ShouldRetry(true, 0)) << i;
  EXPECT_FALSE(policy.ShouldRetry(true, 0));
  EXPECT_EQ(policy.refused(), 1);
  clock.now += absl::Seconds(1);  // a tenth of the budget back
  EXPECT_TRUE(policy.ShouldRetry(true, 0));
  EXPECT_FALSE(policy.ShouldRetry(true, 0));
  clock.now += absl::Hours(1);  // never more than the budget
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(policy.ShouldRetry(true, 0)) << i;
  EXPECT_FALSE(policy.ShouldRetry(true, 0));
}

}  // namespace
}  // namespace hoist
