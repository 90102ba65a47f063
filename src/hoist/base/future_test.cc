#include "hoist/future.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "hoist/mutex.h"

namespace hoist {
namespace {

TEST(FutureTest, WaitReturnsTheValueSetOnAnotherThread) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_FALSE(future.ready());
  std::thread setter([&] { promise.Set(42); });
  EXPECT_EQ(*future.Wait(), 42);
  EXPECT_TRUE(future.ready());
  setter.join();
}

TEST(FutureTest, ErrorsPropagateToEveryCopy) {
  Promise<> promise;
  Future<> a = promise.future();
  Future<> b = a;
  promise.Set(absl::DataLossError("bad bytes"));
  EXPECT_EQ(a.Wait().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(b.Wait().message(), "bad bytes");
}

TEST(FutureTest, SecondSetIsIgnored) {
  Promise<int> promise;
  promise.Set(1);
  promise.Set(2);
  EXPECT_EQ(*promise.future().Wait(), 1);
}

TEST(FutureTest, WaitForTimesOutWhenNothingIsSet) {
  Promise<> promise;
  EXPECT_FALSE(promise.future().WaitFor(absl::Milliseconds(5)));
  promise.Set(absl::OkStatus());
  EXPECT_TRUE(promise.future().WaitFor(absl::Milliseconds(5)));
}

TEST(FutureTest, CallbackRunsOnTheSettingThreadWhenRegisteredEarly) {
  Promise<> promise;
  std::thread::id ran_on;
  Notification done;
  promise.future().OnReady([&](const absl::Status& status) {
    EXPECT_TRUE(status.ok());
    ran_on = std::this_thread::get_id();
    done.Notify();
  });
  std::thread setter([&] { promise.Set(absl::OkStatus()); });
  const std::thread::id setter_id = setter.get_id();
  setter.join();
  ASSERT_TRUE(done.HasBeenNotified());
  EXPECT_EQ(ran_on, setter_id);
}

TEST(FutureTest, CallbackRunsImmediatelyWhenAlreadyReady) {
  Future<int> future = Future<int>::Ready(7);
  int seen = 0;
  future.OnReady([&](const absl::StatusOr<int>& v) { seen = *v; });
  EXPECT_EQ(seen, 7);
}

TEST(FutureTest, DroppedPromiseCancelsItsFuture) {
  Future<> future = [] {
    Promise<> promise;
    return promise.future();
  }();
  EXPECT_EQ(future.Wait().code(), absl::StatusCode::kCancelled);
}

TEST(WhenAllTest, CompletesAfterAllWithTheFirstErrorInOrder) {
  std::vector<Promise<>> promises(3);
  std::vector<Future<>> futures;
  for (auto& p : promises) futures.push_back(p.future());
  Future<> all = WhenAll(futures);
  promises[2].Set(absl::InternalError("third"));
  promises[1].Set(absl::UnavailableError("second"));
  EXPECT_FALSE(all.ready());  // the first is still running
  promises[0].Set(absl::OkStatus());
  ASSERT_TRUE(all.ready());
  EXPECT_EQ(all.Wait().message(), "second");
}

TEST(WhenAllTest, EmptyIsReadyAndOk) { EXPECT_TRUE(WhenAll({}).Wait().ok()); }

TEST(WhenAllTest, ManyThreadsCompletingConcurrently) {
  constexpr int kN = 64;
  std::vector<Promise<>> promises(kN);
  std::vector<Future<>> futures;
  for (auto& p : promises) futures.push_back(p.future());
  Future<> all = WhenAll(futures);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] { promises[i].Set(absl::OkStatus()); });
  }
  EXPECT_TRUE(all.Wait().ok());
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace hoist
