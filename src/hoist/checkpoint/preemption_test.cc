#include "hoist/checkpoint/preemption.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <barrier>
#include <thread>
#include <vector>

#include "testing/manager_test.h"
#include "testing/shared_board.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

PreemptionWatch::Options Fast(std::vector<int> signals = {}) {
  return {.signals = std::move(signals),
          .poll = absl::Milliseconds(5),
          .agree_timeout = absl::Seconds(60),
          .board = "preemption test"};
}

// `size` ranks as threads, in lockstep like a training loop (a barrier per
// step stands for its collectives), each asking Reached(step) every step
// until it says true; `notice(rank, step)` runs on each rank's thread
// before its question. Returns the step each rank stopped at.
std::vector<int64_t> RunJob(
    int size, const std::function<void(int, int64_t, PreemptionWatch&)>& notice,
    std::vector<int> signals = {}) {
  testing::SharedBoard board(size);
  std::vector<std::unique_ptr<testing::BoardCoordinator>> coordinators;
  std::vector<std::unique_ptr<PreemptionWatch>> watches;
  for (int r = 0; r < size; ++r) {
    coordinators.push_back(
        std::make_unique<testing::BoardCoordinator>(board, r));
    absl::StatusOr<std::unique_ptr<PreemptionWatch>> watch =
        PreemptionWatch::Start(*coordinators[r], Fast(signals), nullptr);
    EXPECT_TRUE(watch.ok()) << watch.status();
    watches.push_back(*std::move(watch));
  }
  std::vector<int64_t> stopped(size, -1);
  std::barrier step_done(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      for (int64_t step = 0; step < 100000; ++step) {
        notice(r, step, *watches[r]);
        absl::StatusOr<bool> reached = watches[r]->Reached(step);
        EXPECT_TRUE(reached.ok()) << reached.status();
        // Every rank answers alike, so they leave the loop together.
        step_done.arrive_and_wait();
        if (!reached.ok() || *reached) {
          stopped[r] = step;
          return;
        }
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  return stopped;
}

TEST(PreemptionWatchTest, EveryRankStopsAtTheSameStepAfterOneIsNoticed) {
  const std::vector<int64_t> stopped =
      RunJob(4, [](int rank, int64_t step, PreemptionWatch& watch) {
        if (rank == 2 && step == 7) watch.Notice();
      });
  ASSERT_EQ(stopped.size(), 4u);
  EXPECT_GE(stopped[0], 7);
  for (int64_t step : stopped) EXPECT_EQ(step, stopped[0]);
}

TEST(PreemptionWatchTest, NoticesOnSeveralRanksAgreeToo) {
  const std::vector<int64_t> stopped =
      RunJob(3, [](int rank, int64_t step, PreemptionWatch& watch) {
        if (step == 3 + rank) watch.Notice();
      });
  EXPECT_GE(stopped[0], 3);
  for (int64_t step : stopped) EXPECT_EQ(step, stopped[0]);
}

TEST(PreemptionWatchTest, ASignalIsANotice) {
  // SIGUSR1 raised on rank 1's thread reaches the process; every watch
  // installed for it counts it, as every rank of a job signalled at once.
  const std::vector<int64_t> stopped =
      RunJob(2,
             [](int rank, int64_t step, PreemptionWatch&) {
               if (rank == 1 && step == 4) {
                 ASSERT_EQ(raise(SIGUSR1), 0);
               }
             },
             {SIGUSR1});
  EXPECT_GE(stopped[0], 4);
  EXPECT_EQ(stopped[0], stopped[1]);
}

TEST(PreemptionWatchTest, NeverReachedWithoutANotice) {
  testing::SharedBoard board(1);
  testing::BoardCoordinator coordinator(board, 0);
  auto watch = PreemptionWatch::Start(coordinator, Fast(), nullptr);
  ASSERT_TRUE(watch.ok());
  for (int64_t step = 0; step < 1000; ++step) {
    EXPECT_EQ((*watch)->Reached(step).value_or(true), false);
  }
  EXPECT_FALSE((*watch)->agreed_step().has_value());
  EXPECT_EQ((*watch)->Reached(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PreemptionWatchTest, ARankThatNeverPostsFailsTheWaitNamingTheCount) {
  testing::SharedBoard board(2);  // rank 1 has no watch: it never posts
  testing::BoardCoordinator coordinator(board, 0);
  PreemptionWatch::Options options = Fast();
  options.agree_timeout = absl::Milliseconds(200);
  auto watch = PreemptionWatch::Start(coordinator, options, nullptr);
  ASSERT_TRUE(watch.ok());
  ASSERT_EQ((*watch)->Reached(0).value_or(true), false);
  (*watch)->Notice();
  absl::StatusOr<bool> reached = (*watch)->Reached(1);
  EXPECT_EQ(reached.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(reached.status().message(), HasSubstr("1 of 2 ranks"));
}

TEST(PreemptionWatchTest, ACoordinatorWithoutABoardIsRefused) {
  struct NoBoard final : Coordinator {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    absl::Status Barrier(std::string_view) override { return absl::OkStatus(); }
    absl::StatusOr<std::vector<std::string>> AllGather(std::string_view,
                                                       std::string) override {
      return std::vector<std::string>{};
    }
    absl::StatusOr<std::string> Broadcast(std::string_view, std::string,
                                          int) override {
      return std::string();
    }
  } coordinator;
  auto watch = PreemptionWatch::Start(coordinator, Fast(), nullptr);
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(watch.status().message(), HasSubstr("notice board"));
}

// The manager: the preemption save, on one process.
class ManagerPreemptionTest : public testing::ManagerTest {
 protected:
  static CheckpointManagerOptions Preemptible(int keep_last = 0) {
    CheckpointManagerOptions options = SmallPool(keep_last);
    options.preemption.signals = {SIGUSR1};
    options.preemption.poll = absl::Milliseconds(5);
    return options;
  }
  // Asks ReachedPreemption for steps from `step` on until it says true.
  static int64_t StepReached(CheckpointManager& manager, int64_t step) {
    while (true) {
      absl::StatusOr<bool> reached = manager.ReachedPreemption(step);
      EXPECT_TRUE(reached.ok()) << reached.status();
      if (!reached.ok() || *reached) return step;
      ++step;
    }
  }
};

TEST_F(ManagerPreemptionTest, SavesTheAgreedStepWithoutRetention) {
  auto manager = Open(Preemptible(/*keep_last=*/1));
  for (int64_t step : {10, 20}) {
    ASSERT_TRUE(manager->Save(step, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }
  ASSERT_EQ(raise(SIGUSR1), 0);
  const int64_t step = StepReached(*manager, 21);
  absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tier, Tier::kDurable);
  // keep_last 1 would have deleted step 20: a preemption save leaves it.
  EXPECT_THAT(*manager->List(), ::testing::ElementsAre(20, step));
  for (const PhaseStat& phase : info->phases)
    EXPECT_NE(phase.phase, "retention");
  ExpectHolds(*manager, step, 0);
}

TEST_F(ManagerPreemptionTest, ASaveThatMissesTheDeadlineFailsAndLeavesNoStep) {
  CheckpointManagerOptions options = Preemptible();
  options.preemption.deadline = absl::Seconds(1);
  auto manager = Open(options);
  ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  const absl::Time noticed = absl::Now();
  ASSERT_TRUE(manager->NotePreemption().ok());
  const int64_t step = StepReached(*manager, 2);
  // The job takes longer than the deadline to come to its save.
  absl::SleepFor(noticed + options.preemption.deadline - absl::Now() +
                 absl::Milliseconds(1));
  absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
  absl::Status status =
      handle.ok() ? handle->WaitCommitted().status() : handle.status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("missed its deadline"));
  // Reported once more by the next call, as every background error is.
  EXPECT_EQ(manager->WaitUntilFinished().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(*manager->List(), ::testing::ElementsAre(1));
  ExpectHolds(*manager, 1, 0);
}

TEST_F(ManagerPreemptionTest, GoesToTheLocalTierWhenThereIsOne) {
  CheckpointManagerOptions options = Preemptible();
  options.local.root = temp_.path() + "/local/{rank}";
  options.persist_every = 100;
  auto manager = Open(options);
  ASSERT_TRUE(manager->NotePreemption().ok());
  const int64_t step = StepReached(*manager, 7);
  absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tier, Tier::kLocal);
  EXPECT_FALSE(info->skipped);
}

TEST_F(ManagerPreemptionTest, WithoutSignalsItIsNeverReached) {
  auto manager = Open(SmallPool());
  EXPECT_EQ(manager->ReachedPreemption(5).value_or(true), false);
  EXPECT_EQ(manager->NotePreemption().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace hoist
