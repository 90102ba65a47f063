// CheckpointManager: how a save is staged. Its return modes (staged,
// dispatched, ordered on the caller's stream through fences), dispatch on
// the caller's thread when the saver is idle, saves queued behind others,
// and saves larger than the pool (its overflow, the host memory budget).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "hoist/mutex.h"
#include "testing/copying_producer.h"
#include "testing/manager_test.h"
#include "testing/mixed_model.h"
#include "testing/shard_buffers.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ManagerTest;
using testing::SixteenShardedArrays;

TEST_F(ManagerTest, DispatchedModeLetsTheCallerWaitForStagingItself) {
  auto manager = Open();
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle->WaitStaged().ok());
  testing::Refill(model_, shards_, 99);  // the optimizer step, after staging
  ASSERT_TRUE(handle->WaitCommitted().ok());
  ExpectHolds(*manager, 1, 0);
}

TEST_F(ManagerTest, WaitStagedOnTheHostBackendIsWaitStaged) {
  auto manager = Open();
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle->WaitStagedOn(nullptr).ok());
  // No fence to wait on: the CPU waited, every byte is off the devices.
  EXPECT_TRUE(handle->StagedFences()->empty());
  EXPECT_EQ(handle->progress().staged_bytes.load(),
            handle->progress().total_bytes);
  testing::Refill(model_, shards_, 99);
  ASSERT_TRUE(handle->WaitCommitted().ok());
  ExpectHolds(*manager, 1, 0);
}

// A fence that remembers how many dispatches its device had made when it
// was taken, and which streams were ordered after it.
class RecordingFence final : public CopyFence {
 public:
  explicit RecordingFence(int64_t dispatches) : dispatches_(dispatches) {}
  void* native_handle() const override { return nullptr; }
  absl::Status OrderStream(void* stream) const override {
    MutexLock lock(&mu_);
    streams_.push_back(stream);
    return absl::OkStatus();
  }
  int64_t dispatches() const { return dispatches_; }
  std::vector<void*> streams() const {
    MutexLock lock(&mu_);
    return streams_;
  }

 private:
  const int64_t dispatches_;
  mutable Mutex mu_;
  mutable std::vector<void*> streams_ ABSL_GUARDED_BY(mu_);
};

// The host backend's devices with fences, as a CUDA device has them.
class FencedDevice final : public Device {
 public:
  explicit FencedDevice(Device& device, bool fails = false)
      : device_(device), fails_(fails) {}
  DeviceId id() const override { return device_.id(); }
  Future<> CopyToHost(absl::Span<const CopyOp> ops) override {
    {
      MutexLock lock(&mu_);
      copy_threads_.push_back(std::this_thread::get_id());
    }
    return device_.CopyToHost(ops);
  }
  void HoldCopies() override { device_.HoldCopies(); }
  void ReleaseCopies() override { device_.ReleaseCopies(); }
  // The thread of each CopyToHost call, in order.
  std::vector<std::thread::id> copy_threads() const {
    MutexLock lock(&mu_);
    return copy_threads_;
  }
  Future<> CopyFromHost(absl::Span<const CopyOp> ops) override {
    return device_.CopyFromHost(ops);
  }
  absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) override {
    return device_.Allocate(bytes);
  }
  DeviceCounters counters() const override { return device_.counters(); }
  absl::StatusOr<std::shared_ptr<const CopyFence>> FenceCopiesToHost()
      override {
    if (fails_) return absl::InternalError("cudaEventRecord: injected");
    return std::make_shared<const RecordingFence>(
        device_.counters().dispatches);
  }

 private:
  Device& device_;
  const bool fails_;
  mutable Mutex mu_;
  std::vector<std::thread::id> copy_threads_ ABSL_GUARDED_BY(mu_);
};

class FencedBackend final : public Backend {
 public:
  // `failing`: the index of a device whose fences fail, if any.
  explicit FencedBackend(Backend& backend, int failing = -1)
      : backend_(backend) {
    for (Device* device : backend.devices()) {
      owned_.push_back(std::make_unique<FencedDevice>(
          *device, static_cast<int>(owned_.size()) == failing));
      devices_.push_back(owned_.back().get());
    }
  }
  std::string_view name() const override { return "fenced"; }
  FencedDevice& device(int d) { return *owned_[d]; }
  absl::Span<Device* const> devices() const override { return devices_; }
  absl::StatusOr<MemoryBlock> AllocatePinned(int64_t bytes) override {
    return backend_.AllocatePinned(bytes);
  }

 private:
  Backend& backend_;
  std::vector<std::unique_ptr<FencedDevice>> owned_;
  std::vector<Device*> devices_;
};

TEST_F(ManagerTest, WaitStagedOnOrdersTheStreamAfterEachDevicesLastCopy) {
  FencedBackend fenced(*backend_);
  CheckpointManagerOptions options = SmallPool();
  options.pool_bytes = 16 * 1024;  // several waves
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, fenced, *coordinator_, options);
  ASSERT_TRUE(manager.ok()) << manager.status();
  absl::StatusOr<SaveHandle> handle =
      (*manager)->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  int stream = 0;  // stands for a cudaStream_t
  ASSERT_TRUE(handle->WaitStagedOn(&stream).ok());
  absl::StatusOr<CopyFences> fences = handle->StagedFences();
  ASSERT_TRUE(fences.ok()) << fences.status();
  ASSERT_EQ(fences->size(), backend_->devices().size());
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->waves, 1);
  for (size_t d = 0; d < fences->size(); ++d) {
    const auto& fence = static_cast<const RecordingFence&>(*(*fences)[d]);
    // Taken after the device's last copy of the save, not after a wave.
    EXPECT_EQ(fence.dispatches(), backend_->devices()[d]->counters().dispatches)
        << "device " << d;
    EXPECT_THAT(fence.streams(), ElementsAre(&stream));
  }
  ExpectHolds(**manager, 1, 0);
}

// With nothing in flight, Save dispatches on the caller's thread: a save
// in dispatched mode returns with every copy enqueued without waiting for
// the saver thread to wake. Later waves (a pool smaller than the save) are
// the saver's.
TEST_F(ManagerTest, AnIdleSaverLetsSaveDispatchOnTheCallersThread) {
  FencedBackend fenced(*backend_);
  for (const int64_t pool : {int64_t{1} << 20, int64_t{16} << 10}) {
    const std::string root = root_ + std::to_string(pool);
    CheckpointManagerOptions options = SmallPool();
    options.pool_bytes = pool;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root, fenced, *coordinator_, options);
    ASSERT_TRUE(manager.ok()) << manager.status();
    std::vector<size_t> before;
    for (int d = 0; d < 8; ++d) {
      before.push_back(fenced.device(d).copy_threads().size());
    }
    absl::StatusOr<SaveHandle> handle =
        (*manager)->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    ASSERT_TRUE(info.ok()) << info.status();
    int here = 0, elsewhere = 0;
    for (int d = 0; d < 8; ++d) {
      const std::vector<std::thread::id> threads =
          fenced.device(d).copy_threads();
      for (size_t i = before[d]; i < threads.size(); ++i) {
        (threads[i] == std::this_thread::get_id() ? here : elsewhere)++;
      }
    }
    if (pool == int64_t{1} << 20) {
      EXPECT_EQ(info->waves, 1);
      EXPECT_EQ(here, 8);  // one dispatch per device, all from here
      EXPECT_EQ(elsewhere, 0);
    } else {
      EXPECT_GT(info->waves, 1);
      EXPECT_GT(here, 0) << "the first wave from here";
      EXPECT_GT(elsewhere, 0) << "later waves on the saver thread";
    }
    ExpectHolds(**manager, 1, 0);
  }
}

// With room for two saves in flight, a save asked for while the saver is
// busy is staged by the saver from the layout kept with the plan, from the
// arrays as they were when it was asked for, in one wave and in several.
TEST_F(ManagerTest, ASaveQueuedBehindAnotherIsStagedByTheSaverExactly) {
  for (const int64_t pool : {int64_t{1} << 20, int64_t{16} << 10}) {
    CheckpointManagerOptions options = SmallPool();
    options.pool_bytes = pool;
    options.max_in_flight = 2;
    auto manager = Open(options);
    ASSERT_NE(manager, nullptr);
    std::vector<SaveHandle> handles;
    for (int64_t step = 1; step <= 3; ++step) {
      testing::Refill(model_, shards_, static_cast<uint64_t>(step));
      absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
      ASSERT_TRUE(handle.ok()) << handle.status();
      handles.push_back(*std::move(handle));
    }
    for (SaveHandle& handle : handles) {
      ASSERT_TRUE(handle.WaitCommitted().ok()) << handle.status();
    }
    for (int64_t step = 1; step <= 3; ++step) {
      ExpectHolds(*manager, step, static_cast<uint64_t>(step));
    }
    manager.reset();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
}

// A share staging refuses before any copy (a slice larger than the pool)
// is Save's error in either mode: nothing was dispatched.
TEST_F(ManagerTest, AShareStagingRefusesIsSavesErrorInEitherMode) {
  CheckpointManagerOptions options = SmallPool();
  options.pool_bytes = 4096;
  options.plan.min_slice_bytes = int64_t{1} << 20;  // saved whole: 16 KiB
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  const std::vector<ArraySpec> big = BigReplicatedArray();
  testing::DeviceShards shards = testing::FillShards(big, backend_->devices());
  for (ReturnWhen when : {ReturnWhen::kStaged, ReturnWhen::kDispatched}) {
    absl::StatusOr<SaveHandle> handle =
        manager->Save(1, testing::SaveArraysOf(big, shards), "{}", when);
    EXPECT_EQ(handle.status().code(), absl::StatusCode::kResourceExhausted)
        << handle.status();
    manager->WaitUntilFinished().IgnoreError();
  }
  EXPECT_TRUE(manager->List()->empty());
}

TEST_F(ManagerTest, AFenceThatFailsMakesWaitStagedOnWaitOnTheCpu) {
  FencedBackend fenced(*backend_, /*failing=*/3);
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, fenced, *coordinator_, SmallPool());
  ASSERT_TRUE(manager.ok()) << manager.status();
  absl::StatusOr<SaveHandle> handle =
      (*manager)->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  int stream = 0;
  ASSERT_TRUE(handle->WaitStagedOn(&stream).ok());
  // No fence at all, so no stream was ordered: the CPU waited instead.
  EXPECT_TRUE(handle->StagedFences()->empty());
  EXPECT_EQ(handle->progress().staged_bytes.load(),
            handle->progress().total_bytes);
  testing::Refill(model_, shards_, 99);
  ASSERT_TRUE(handle->WaitCommitted().ok());
  ExpectHolds(**manager, 1, 0);
}

// A save 32 times the pool returns once its arrays are copied, while
// storage has not written a byte: what the pool does not hold is staged
// into its overflow. Then it commits what was saved.
TEST_F(ManagerTest, ASaveLargerThanThePoolIsStagedWhileStorageIsStuck) {
  model_ = SixteenShardedArrays();
  shards_ = testing::FillShards(model_, backend_->devices());
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {});
  CheckpointManagerOptions options;
  options.pool_bytes = 64 << 10;
  options.host_memory_budget = 4 << 20;
  std::unique_ptr<CheckpointManager> manager = Open(options, &storage);
  ASSERT_NE(manager, nullptr);
  storage.Stall();
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, Arrays(), "{}", ReturnWhen::kDispatched);
  ASSERT_TRUE(handle.ok()) << handle.status();
  // Bounded, so that staging that waits for storage fails the test.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (handle->progress().staged_bytes.load() <
             handle->progress().total_bytes &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(handle->progress().staged_bytes.load(), 2 << 20);
  EXPECT_TRUE(handle->WaitStaged().ok());
  EXPECT_EQ(handle->progress().written_bytes.load(), 0);  // storage is stuck
  storage.Resume();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GE(info->overflow_bytes, (2 << 20) - (64 << 10));
  EXPECT_EQ(info->stalled_bytes, 0);
  EXPECT_EQ(info->blocked_reason, "");
  ExpectHolds(*manager, 1, 0);
}

// A save larger than the budget stages what does not fit as the writes
// free the pool, and says why it waited and which setting to raise.
TEST_F(ManagerTest, ASaveLargerThanTheBudgetWaitsForStorageAndSaysWhy) {
  model_ = SixteenShardedArrays();
  shards_ = testing::FillShards(model_, backend_->devices());
  CheckpointManagerOptions options;
  options.pool_bytes = 64 << 10;
  options.host_memory_budget = 128 << 10;  // a 64 KiB overflow
  std::unique_ptr<CheckpointManager> manager = Open(options);
  ASSERT_NE(manager, nullptr);
  absl::StatusOr<SaveHandle> handle = manager->Save(1, Arrays());
  ASSERT_TRUE(handle.ok()) << handle.status();
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->overflow_bytes, 0);
  EXPECT_GT(info->stalled_bytes, 0);
  EXPECT_EQ(handle->progress().stalled_bytes.load(), info->stalled_bytes);
  EXPECT_THAT(info->blocked_reason, HasSubstr("waited for storage"));
  EXPECT_THAT(info->blocked_reason, HasSubstr("host_memory_budget 128.0 KiB"));
  ExpectHolds(*manager, 1, 0);
}

// Shards a producer makes (XLA shards staged through their runtime) are
// asked for a wave at a time, one call a wave, and each released once
// copied: the save holds at most a wave of them beside the pool and what is
// left of the budget for its overflow. Registered arrays cannot be.
TEST_F(ManagerTest, ProducedShardsAreSavedAWaveAtATimeAndReleased) {
  model_ = SixteenShardedArrays();  // 2 MiB
  shards_ = testing::FillShards(model_, backend_->devices());
  CheckpointManagerOptions options;
  options.pool_bytes = 64 << 10;
  options.host_memory_budget = 4 << 20;
  std::unique_ptr<CheckpointManager> manager = Open(options);
  ASSERT_NE(manager, nullptr);
  std::vector<SaveArray> arrays = Arrays();
  testing::CopyingProducer::MarkProduced(arrays);
  auto producer = std::make_shared<testing::CopyingProducer>(model_, shards_);
  SaveOptions save_options;
  save_options.producer = producer;
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, arrays, "{}", ReturnWhen::kStaged, save_options);
  ASSERT_TRUE(handle.ok()) << handle.status();
  producer->ExpectAllReleased();  // once staged, none is held
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_GT(info->waves, 1);
  EXPECT_EQ(producer->calls(), info->waves);
  EXPECT_LE(producer->peak_live_bytes(), 32 << 10);  // a wave: half the pool
  ExpectHolds(*manager, 1, 0);

  absl::StatusOr<SaveHandle> unproduced = manager->Save(2, arrays);
  EXPECT_EQ(unproduced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unproduced.status().message(), HasSubstr("no producer"));
  absl::StatusOr<RegisteredArrays> registered = manager->Register(arrays);
  EXPECT_EQ(registered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(registered.status().message(), HasSubstr("to be produced"));
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(1));
}

TEST_F(ManagerTest, ABudgetSmallerThanThePoolIsRefused) {
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  options.host_memory_budget = 512 << 10;
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, *backend_, *coordinator_, options);
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(manager.status().message(), HasSubstr("pool_bytes"));
  options.host_memory_budget = -1;
  EXPECT_EQ(CheckpointManager::Open(root_, *backend_, *coordinator_, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hoist
