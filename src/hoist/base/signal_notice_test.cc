#include "hoist/base/signal_notice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>

namespace hoist {
namespace {

std::atomic<int> job_handler_calls{0};
void JobHandler(int) { job_handler_calls.fetch_add(1); }

// The handler a job had before: SIGUSR2 counts into job_handler_calls.
class SignalNoticeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct sigaction job = {};
    job.sa_handler = JobHandler;
    sigemptyset(&job.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR2, &job, &before_), 0);
    job_handler_calls = 0;
  }
  void TearDown() override { sigaction(SIGUSR2, &before_, nullptr); }
  struct sigaction before_;
};

TEST_F(SignalNoticeTest, CountsTheSignalAndCallsTheJobsHandler) {
  absl::StatusOr<std::unique_ptr<SignalNotice>> notice =
      SignalNotice::Install({SIGUSR2});
  ASSERT_TRUE(notice.ok()) << notice.status();
  const int64_t before = SignalNotice::count();
  ASSERT_EQ(raise(SIGUSR2), 0);  // delivered before raise returns
  EXPECT_EQ(SignalNotice::count(), before + 1);
  EXPECT_EQ(job_handler_calls.load(), 1);
  EXPECT_TRUE((*notice)->installed());
}

TEST_F(SignalNoticeTest, TheLastRegistrationPutsTheJobsHandlerBack) {
  auto first = SignalNotice::Install({SIGUSR2});
  auto second = SignalNotice::Install({SIGUSR2});
  ASSERT_TRUE(first.ok() && second.ok());
  first->reset();
  struct sigaction now;
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &now), 0);
  EXPECT_NE(now.sa_handler, JobHandler);  // hoist's, for `second`
  second->reset();
  ASSERT_EQ(sigaction(SIGUSR2, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, JobHandler);
  const int64_t before = SignalNotice::count();
  ASSERT_EQ(raise(SIGUSR2), 0);
  EXPECT_EQ(SignalNotice::count(), before);  // no longer counted
  EXPECT_EQ(job_handler_calls.load(), 1);
}

TEST_F(SignalNoticeTest, SaysWhenTheJobReplacedItsHandler) {
  auto notice = SignalNotice::Install({SIGUSR2});
  ASSERT_TRUE(notice.ok());
  struct sigaction job = {};
  job.sa_handler = JobHandler;
  ASSERT_EQ(sigaction(SIGUSR2, &job, nullptr), 0);
  EXPECT_FALSE((*notice)->installed());
}

TEST(SignalNoticeErrors, RefusesSignalsThatCannotBeCaught) {
  for (int signal : {SIGKILL, SIGSTOP, 0, NSIG + 5}) {
    absl::StatusOr<std::unique_ptr<SignalNotice>> notice =
        SignalNotice::Install({signal});
    EXPECT_EQ(notice.status().code(), absl::StatusCode::kInvalidArgument)
        << signal;
  }
}

}  // namespace
}  // namespace hoist
