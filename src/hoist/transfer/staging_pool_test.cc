#include "hoist/transfer/staging_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "hoist/host_backend.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

class StagingPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<StagingPool> MakePool(int64_t capacity) {
    return *StagingPool::Create(*backend_, capacity);
  }
  std::unique_ptr<Backend> backend_ = *MakeHostBackend({.num_devices = 1});
};

TEST_F(StagingPoolTest, LeasesAreAlignedDisjointAndReturnThemselves) {
  auto pool = MakePool(64 * 1024);
  {
    absl::StatusOr<std::vector<Lease>> leases =
        pool->AcquireAll({100, 5000, 4096});
    ASSERT_TRUE(leases.ok()) << leases.status();
    std::vector<std::pair<uint8_t*, uint8_t*>> ranges;
    for (const Lease& lease : *leases) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(lease.data()) % 4096, 0u);
      ranges.emplace_back(lease.data(), lease.data() + lease.size_bytes());
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      EXPECT_LE(ranges[i - 1].second, ranges[i].first);
    }
    EXPECT_EQ((*leases)[1].size_bytes(), 5000);
    // 4 KiB + 8 KiB + 4 KiB reserved.
    EXPECT_EQ(pool->stats().in_use_bytes, 16 * 1024);
  }
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_EQ(pool->stats().peak_bytes, 16 * 1024);
  EXPECT_EQ(pool->stats().leases, 3);
}

TEST_F(StagingPoolTest, TakeFrontSplitsALeaseIntoRangesReturnedOneByOne) {
  auto pool = MakePool(5 * 4096);
  Lease block = *pool->Acquire(4 * 4096);
  uint8_t* const base = block.data();
  Lease first = block.TakeFront(100);  // 4 KiB reserved
  Lease second = block.TakeFront(4096 + 1);
  EXPECT_EQ(first.data(), base);
  EXPECT_EQ(first.size_bytes(), 100);
  EXPECT_EQ(first.reserved_bytes(), 4096);
  EXPECT_EQ(second.data(), base + 4096);
  EXPECT_EQ(second.reserved_bytes(), 2 * 4096);
  EXPECT_EQ(block.data(), base + 3 * 4096);
  EXPECT_EQ(block.size_bytes(), 4096);
  // Each range goes back on its own: the middle one frees 8 KiB, which
  // with the pool's spare 4 KiB is not yet 3 contiguous pages.
  second.Release();
  EXPECT_EQ(pool->stats().in_use_bytes, 2 * 4096);
  EXPECT_FALSE(pool->Acquire(3 * 4096, absl::Milliseconds(1)).ok());
  Lease last = block.TakeFront(4096);
  EXPECT_FALSE(block);  // nothing left
  EXPECT_EQ(last.data(), base + 3 * 4096);
  first.Release();
  last.Release();
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_TRUE(pool->Acquire(5 * 4096).ok());
}

TEST_F(StagingPoolTest, MovedLeaseReleasesOnce) {
  auto pool = MakePool(8192);
  Lease a = *pool->Acquire(8192);
  Lease b = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_TRUE(b);
  b.Release();
  b.Release();
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_TRUE(pool->Acquire(8192).ok());
}

TEST_F(StagingPoolTest, RequestThatCanNeverFitIsResourceExhausted) {
  auto pool = MakePool(16 * 1024);
  absl::Status status = pool->Acquire(16 * 1024 + 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("can never fit"));
  // Each of these fits, but not all four together once aligned.
  EXPECT_EQ(pool->AcquireAll({4097, 4097}).status().code(),
            absl::StatusCode::kOk);
  EXPECT_EQ(pool->AcquireAll({4097, 4097, 1}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Acquire(0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StagingPoolTest, AcquireWaitsUntilSpaceIsReleased) {
  auto pool = MakePool(8192);
  Lease held = *pool->Acquire(8192);
  Notification acquired;
  std::thread waiter([&] {
    absl::StatusOr<Lease> lease = pool->Acquire(4096);
    EXPECT_TRUE(lease.ok());
    acquired.Notify();
  });
  // The waiter counts itself under the pool's lock and then waits: once the
  // count shows it, it is waiting (no sleep decides this).
  while (pool->stats().waits == 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_FALSE(acquired.HasBeenNotified());  // `held` still fills the pool
  held.Release();
  acquired.WaitForNotification();
  waiter.join();
  EXPECT_EQ(pool->stats().waits, 1);
}

TEST_F(StagingPoolTest, AcquireTimesOutWithDeadlineExceeded) {
  auto pool = MakePool(4096);
  Lease held = *pool->Acquire(4096);
  absl::Status status = pool->Acquire(4096, absl::Milliseconds(10)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(StagingPoolTest, FreedNeighboursCoalesceForALargeLease) {
  auto pool = MakePool(4 * 4096);
  std::vector<Lease> leases = *pool->AcquireAll({4096, 4096, 4096, 4096});
  leases[1].Release();
  leases[2].Release();
  // 8 KiB contiguous in the middle.
  absl::StatusOr<Lease> middle = pool->Acquire(8192, absl::Milliseconds(10));
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(middle->data(), leases[0].data() + 4096);
}

TEST_F(StagingPoolTest, ABatchFillsOneFreeBlockInOrderOrSpreadsOverSeveral) {
  auto pool = MakePool(8 * 4096);
  // An empty pool: the batch lies one lease after the other, as asked.
  {
    std::vector<Lease> batch = *pool->AcquireAll({4096, 3 * 4096, 100});
    EXPECT_EQ(batch[1].data(), batch[0].data() + 4096);
    EXPECT_EQ(batch[2].data(), batch[0].data() + 4 * 4096);
    EXPECT_EQ(pool->stats().in_use_bytes, 5 * 4096);
  }
  // Free 4 KiB, 8 KiB and 12 KiB blocks, none of which holds all of a 20
  // KiB batch: each lease, largest first, takes the first block it fits.
  std::vector<Lease> all =
      *pool->AcquireAll({4096, 4096, 2 * 4096, 4096, 3 * 4096});
  uint8_t* const base = all[0].data();
  all[0].Release();  // [0, 4 KiB)
  all[2].Release();  // [8, 16 KiB)
  all[4].Release();  // [20, 32 KiB)
  std::vector<Lease> spread = *pool->AcquireAll({4096, 3 * 4096, 2 * 4096});
  EXPECT_EQ(spread[1].data(), base + 5 * 4096);
  EXPECT_EQ(spread[2].data(), base + 2 * 4096);
  EXPECT_EQ(spread[0].data(), base);
  EXPECT_EQ(pool->stats().in_use_bytes, 8 * 4096);
}

TEST_F(StagingPoolTest, AllOrNothingNeverHoldsPartOfABatchWhileWaiting) {
  auto pool = MakePool(3 * 4096);
  Lease held = *pool->Acquire(2 * 4096);
  // Needs 2 x 4 KiB; only 4 KiB is free: it must wait without taking it.
  Notification acquired;
  std::thread waiter([&] {
    EXPECT_TRUE(pool->AcquireAll({4096, 4096}).ok());
    acquired.Notify();
  });
  EXPECT_FALSE(acquired.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  EXPECT_EQ(pool->stats().in_use_bytes, 2 * 4096);
  held.Release();
  acquired.WaitForNotification();
  waiter.join();
}

TEST_F(StagingPoolTest, ManyThreadsChurnWithoutLosingBytes) {
  auto pool = MakePool(64 * 1024);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const int64_t size = 1 + (t * 977 + i * 131) % (20 * 1024);
        absl::StatusOr<Lease> lease = pool->Acquire(size);
        ASSERT_TRUE(lease.ok());
        std::memset(lease->data(), t, lease->size_bytes());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_LE(pool->stats().peak_bytes, 64 * 1024);
  EXPECT_TRUE(pool->Acquire(64 * 1024, absl::Milliseconds(10)).ok());
}

TEST_F(StagingPoolTest, PendingPoolLeasesWaitForItsMemory) {
  auto pool = *StagingPool::CreatePending(64 * 1024);
  // An empty batch needs no memory.
  ASSERT_TRUE(pool->AcquireAll({}).ok());
  EXPECT_EQ(pool->AcquireAll({4096}, absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<Lease> lease;
  std::thread waiter([&] { lease = pool->Acquire(8192); });
  pool->Provide(backend_->AllocatePinned(pool->capacity_bytes()));
  waiter.join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  std::memset(lease->data(), 0x5a, 8192);  // real memory
  EXPECT_EQ(pool->stats().in_use_bytes, 8192);
}

TEST_F(StagingPoolTest, PendingPoolWhoseAllocationFailedReturnsItsError) {
  auto pool = *StagingPool::CreatePending(64 * 1024);
  pool->Provide(absl::ResourceExhaustedError("mmap of the pool failed"));
  absl::StatusOr<Lease> lease = pool->Acquire(4096);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(lease.status().message(), HasSubstr("mmap of the pool failed"));
}

// TryAcquireFront leases the pool's first bytes or nothing, never waiting;
// what stays free is then one range, where a batch that fits always goes.
TEST_F(StagingPoolTest, TryAcquireFrontTakesTheFirstBytesOrNothing) {
  auto pending = *StagingPool::CreatePending(64 * 1024);
  EXPECT_FALSE(pending->TryAcquireFront(4096).has_value());  // no memory yet

  auto pool = MakePool(64 * 1024);
  Lease base = *pool->Acquire(64 * 1024);
  uint8_t* const first = base.data();
  base.Release();
  {
    Lease other = *pool->Acquire(4096);  // the pool's first 4 KiB
    EXPECT_FALSE(pool->TryAcquireFront(8192).has_value());
  }
  std::optional<Lease> front = pool->TryAcquireFront(5000);
  ASSERT_TRUE(front.has_value());
  EXPECT_EQ(front->data(), first);
  EXPECT_EQ(front->size_bytes(), 5000);
  EXPECT_EQ(front->reserved_bytes(), 8192);
  EXPECT_EQ(pool->stats().in_use_bytes, 8192);
  EXPECT_FALSE(pool->TryAcquireFront(4096).has_value());  // taken
  // The rest is one range: a batch of all of it fits.
  absl::StatusOr<std::vector<Lease>> rest =
      pool->AcquireAll({24 * 1024, 32 * 1024}, absl::ZeroDuration());
  ASSERT_TRUE(rest.ok()) << rest.status();
  rest->clear();
  front.reset();
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
  EXPECT_FALSE(pool->TryAcquireFront(65 * 1024).has_value());  // too large
}

// TryAcquireAll places a batch now or reserves nothing, never waiting for
// space; a pending pool's memory it does wait for.
TEST_F(StagingPoolTest, TryAcquireAllPlacesABatchNowOrReservesNothing) {
  auto pool = MakePool(64 * 1024);
  absl::StatusOr<std::optional<std::vector<Lease>>> first =
      pool->TryAcquireAll({16 * 1024, 20 * 1024});
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status();
  EXPECT_EQ(pool->stats().in_use_bytes, 16 * 1024 + 20 * 1024);
  absl::StatusOr<std::optional<std::vector<Lease>>> second =
      pool->TryAcquireAll({16 * 1024, 16 * 1024});
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->has_value());  // 32 KiB do not fit in 28: nothing
  EXPECT_EQ(pool->stats().in_use_bytes, 36 * 1024);
  EXPECT_EQ(pool->stats().waits, 0);
  EXPECT_EQ(pool->TryAcquireAll({128 * 1024}).status().code(),
            absl::StatusCode::kResourceExhausted);  // never fits

  auto pending = *StagingPool::CreatePending(64 * 1024);
  absl::StatusOr<std::optional<std::vector<Lease>>> later;
  std::thread waiter([&] { later = pending->TryAcquireAll({8192}); });
  pending->Provide(backend_->AllocateOverflow(pending->capacity_bytes()));
  waiter.join();
  ASSERT_TRUE(later.ok() && later->has_value()) << later.status();
  std::memset((**later)[0].data(), 0x5a, 8192);  // real memory
}

}  // namespace
}  // namespace hoist
