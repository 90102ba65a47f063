// The CUDA backend under the CUDA runtime simulator (testing/cuda_sim,
// built with -DHOIST_CUDA_SIM=ON): what a host copy hides and a GPU would
// do to it. Each test names the guard in cuda_backend.cc whose removal
// makes it fail (docs/cuda.md).
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "hoist/cuda_backend.h"
#include "testing/cuda_sim/cuda_sim.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

class CudaBackendSimTest : public ::testing::Test {
 protected:
  void SetUp() override { cuda_sim::Reset(); }
  void TearDown() override {
    EXPECT_THAT(cuda_sim::Violations(), IsEmpty());
    cuda_sim::Reset();
  }

  static std::unique_ptr<Backend> NewBackend(CudaBackendOptions options = {}) {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(options);
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? *std::move(backend) : nullptr;
  }

  // `bytes` on `device`, each byte (i * 7 + salt), set through the backend.
  static MemoryBlock Filled(Backend& backend, Device& device, int64_t bytes,
                            uint8_t salt) {
    absl::StatusOr<MemoryBlock> pinned = backend.AllocatePinned(bytes);
    absl::StatusOr<MemoryBlock> on_device = device.Allocate(bytes);
    EXPECT_TRUE(pinned.ok() && on_device.ok());
    auto* host = static_cast<uint8_t*>(pinned->data());
    for (int64_t i = 0; i < bytes; ++i) host[i] = Byte(i, salt);
    const CopyOp up{host, bytes, on_device->data(), bytes, bytes, 1};
    EXPECT_TRUE(device.CopyFromHost({&up, 1}).Wait().ok());
    return *std::move(on_device);
  }
  static uint8_t Byte(int64_t i, uint8_t salt) {
    return static_cast<uint8_t>(i * 7 + salt);
  }
};

constexpr int64_t kBytes = 1 << 20;

// Holds `devices`' streams from construction until Resume() or the end of
// the scope, so that a test failing while they are held does not leave
// the backend waiting on them forever.
class Paused {
 public:
  explicit Paused(std::vector<int> devices) : devices_(std::move(devices)) {
    for (int device : devices_) cuda_sim::Pause(device);
  }
  ~Paused() { Resume(); }
  void Resume() {
    for (int device : devices_) cuda_sim::Resume(device);
    devices_.clear();
  }

 private:
  std::vector<int> devices_;
};

// One dispatch per device, whatever its number of ops: one
// cudaMemcpyBatchAsync for the contiguous ops and one
// cudaMemcpy3DBatchAsync for the strided ones, into pinned memory (no
// pageable copy), and both devices' copies in flight before either is
// awaited.
TEST_F(CudaBackendSimTest, EachDeviceGetsOneBatchOfEachKindPerDispatch) {
  std::unique_ptr<Backend> backend = NewBackend();
  ASSERT_EQ(backend->devices().size(), 2u);
  std::vector<MemoryBlock> on_device, staged;
  std::vector<Future<>> copies;
  for (int d = 0; d < 2; ++d) {
    Device& device = *backend->devices()[d];
    on_device.push_back(Filled(*backend, device, kBytes, d));
    staged.push_back(*backend->AllocatePinned(kBytes));
  }
  const int64_t calls_before = cuda_sim::CountsOf(0).copy_calls;
  Paused paused({0, 1});
  for (int d = 0; d < 2; ++d) {
    const auto* src = static_cast<const uint8_t*>(on_device[d].data());
    auto* dst = static_cast<uint8_t*>(staged[d].data());
    const CopyOp ops[] = {
        {src, 4096, dst, 4096, 4096, 1},
        {src + 8192, 4096, dst + 8192, 4096, 4096, 1},
        {src + 16384, 8192, dst + 16384, 8192, 8192, 1},
        {src + 65536, 1000, dst + 65536, 300, 300, 100},
        {src + 262144, 2048, dst + 262144, 512, 512, 64},
    };
    copies.push_back(backend->devices()[d]->CopyToHost(ops));
  }
  // Both dispatched, neither run: the staged bytes are poison.
  EXPECT_FALSE(copies[0].ready() || copies[1].ready());
  EXPECT_EQ(static_cast<uint8_t*>(staged[0].data())[0], cuda_sim::kPoison);
  paused.Resume();
  for (int d = 0; d < 2; ++d) {
    ASSERT_TRUE(copies[d].Wait().ok()) << copies[d].Wait();
    const auto* dst = static_cast<const uint8_t*>(staged[d].data());
    EXPECT_EQ(dst[8192 + 100], Byte(8192 + 100, d));
    EXPECT_EQ(dst[65536 + 99 * 300 + 299], Byte(65536 + 99 * 1000 + 299, d));
    EXPECT_EQ(dst[262144 + 63 * 512 + 511], Byte(262144 + 63 * 2048 + 511, d));
    EXPECT_EQ(backend->devices()[d]->counters().dispatches, 2);  // up, down
    EXPECT_EQ(cuda_sim::CountsOf(d).pageable_copies, 0);
  }
  EXPECT_EQ(cuda_sim::CountsOf(0).copy_calls - calls_before, 2);
  EXPECT_EQ(cuda_sim::Calls("cudaMemcpy3DBatchAsync"), 2);  // one a device
  EXPECT_EQ(cuda_sim::Calls("cudaMemcpyBatchAsync"), 4);    // + the uploads
  EXPECT_EQ(cuda_sim::Calls("cudaMemcpyAsync"), 0);
}

// Guard: the completion thread completes a future only after
// cudaEventSynchronize of the dispatch's event. The bytes are read the
// moment the future completes, so a future completed earlier would show
// poison.
TEST_F(CudaBackendSimTest, StagedBytesAreCompleteWhenTheFutureIs) {
  std::unique_ptr<Backend> backend = NewBackend();
  Device& device = *backend->devices()[0];
  MemoryBlock on_device = Filled(*backend, device, kBytes, 3);
  MemoryBlock staged = *backend->AllocatePinned(kBytes);
  const CopyOp down{on_device.data(), kBytes, staged.data(), kBytes, kBytes, 1};
  Paused paused({0});
  Future<> copied = device.CopyToHost({&down, 1});
  // The callback runs on the thread that completes the future, after the
  // waiters are released: it says when it is done.
  std::vector<uint8_t> seen;
  Promise<> looked;
  Future<> looked_at = looked.future();
  copied.OnReady([&, looked = std::move(looked)](const absl::Status&) mutable {
    const auto* bytes = static_cast<const uint8_t*>(staged.data());
    seen.assign(bytes, bytes + kBytes);
    looked.Set(absl::OkStatus());
  });
  paused.Resume();
  ASSERT_TRUE(copied.Wait().ok());
  ASSERT_TRUE(looked_at.Wait().ok());
  ASSERT_EQ(seen.size(), static_cast<size_t>(kBytes));
  for (int64_t i = 0; i < kBytes; i += 4099) {
    ASSERT_EQ(seen[i], Byte(i, 3)) << "byte " << i;
  }
}

// Guard: BatchUnsupported. A driver without the batch calls gets one
// cudaMemcpyAsync / cudaMemcpy2DAsync per op, still one dispatch, and the
// failed batch call's error does not linger as the thread's last error.
TEST_F(CudaBackendSimTest, WithoutBatchCallsEachOpIsQueuedInTheSameDispatch) {
  cuda_sim::Config config;
  config.batch_copies = false;
  cuda_sim::Reset(config);
  std::unique_ptr<Backend> backend = NewBackend();
  Device& device = *backend->devices()[0];
  MemoryBlock on_device = Filled(*backend, device, kBytes, 5);
  MemoryBlock staged = *backend->AllocatePinned(kBytes);
  const auto* src = static_cast<const uint8_t*>(on_device.data());
  auto* dst = static_cast<uint8_t*>(staged.data());
  const CopyOp ops[] = {
      {src, 4096, dst, 4096, 4096, 1},
      {src + 8192, 4096, dst + 8192, 4096, 4096, 1},
      {src + 65536, 1000, dst + 65536, 300, 300, 100},
  };
  ASSERT_TRUE(device.CopyToHost(ops).Wait().ok());
  EXPECT_EQ(dst[8192 + 5], Byte(8192 + 5, 5));
  EXPECT_EQ(dst[65536 + 300 + 1], Byte(65536 + 1000 + 1, 5));
  EXPECT_EQ(cuda_sim::Calls("cudaMemcpyAsync"), 1 + 2);  // upload + 2
  EXPECT_EQ(cuda_sim::Calls("cudaMemcpy2DAsync"), 1);
  EXPECT_EQ(device.counters().dispatches, 2);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Guard: CompleteLoop passes cudaEventSynchronize's error to the future. An
// asynchronous copy failure fails that dispatch's future, named; the next
// dispatch succeeds.
TEST_F(CudaBackendSimTest, AnAsynchronousCopyErrorFailsItsFuture) {
  std::unique_ptr<Backend> backend = NewBackend();
  Device& device = *backend->devices()[1];
  MemoryBlock on_device = Filled(*backend, device, kBytes, 9);
  MemoryBlock staged = *backend->AllocatePinned(kBytes);
  const CopyOp down{on_device.data(), kBytes, staged.data(), kBytes, kBytes, 1};
  cuda_sim::FailNextCopy(1, cudaErrorLaunchFailure);
  absl::Status failed = device.CopyToHost({&down, 1}).Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.message(), HasSubstr("cudaErrorLaunchFailure"));
  ASSERT_TRUE(device.CopyToHost({&down, 1}).Wait().ok());
  EXPECT_EQ(static_cast<uint8_t*>(staged.data())[77], Byte(77, 9));
}

// Guard: AllocatePinned's check of cudaHostRegister, and its munmap on
// failure. Registration is once per block; a failure is named.
TEST_F(CudaBackendSimTest, PinnedBlocksRegisterOnceAndFailuresAreNamed) {
  std::unique_ptr<Backend> backend = NewBackend();
  {
    absl::StatusOr<MemoryBlock> a = backend->AllocatePinned(kBytes);
    absl::StatusOr<MemoryBlock> b = backend->AllocatePinned(kBytes + 1);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(cuda_sim::Calls("cudaHostRegister"), 2);
  }
  EXPECT_EQ(cuda_sim::Calls("cudaHostUnregister"), 2);
  cuda_sim::FailNextCall("cudaHostRegister",
                         cudaErrorHostMemoryAlreadyRegistered);
  absl::StatusOr<MemoryBlock> refused = backend->AllocatePinned(kBytes);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("cudaHostRegister(staging pool)"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("cudaErrorHostMemoryAlreadyRegistered"));
  // Without NUMA information: cudaHostAlloc, freed with cudaFreeHost.
  backend.reset();
  cuda_sim::Config config;
  config.host_numa_ids = {-1, -1};
  cuda_sim::Reset(config);
  backend = NewBackend();
  ASSERT_TRUE(backend->AllocatePinned(kBytes).ok());
  EXPECT_EQ(cuda_sim::Calls("cudaHostAlloc"), 1);
  EXPECT_EQ(cuda_sim::Calls("cudaFreeHost"), 1);
}

// Guard: Enqueue's cudaStreamWaitEvent on the compute stream. Training's
// last write, still queued on its stream when the save dispatches, is what
// the copy reads.
TEST_F(CudaBackendSimTest, CopiesWaitForTheComputeStreamsQueuedWork) {
  cudaStream_t training = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&training, cudaStreamNonBlocking),
            cudaSuccess);
  {
    std::unique_ptr<Backend> backend =
        NewBackend({.ordinals = {0}, .compute_streams = {training}});
    Device& device = *backend->devices()[0];
    MemoryBlock on_device = *device.Allocate(kBytes);
    MemoryBlock staged = *backend->AllocatePinned(kBytes);
    Paused paused({0});
    ASSERT_EQ(cudaMemsetAsync(on_device.data(), 0x77, kBytes, training),
              cudaSuccess);
    const CopyOp down{on_device.data(), kBytes, staged.data(),
                      kBytes,           kBytes, 1};
    Future<> copied = device.CopyToHost({&down, 1});
    paused.Resume();
    ASSERT_TRUE(copied.Wait().ok()) << copied.Wait();
    const auto* bytes = static_cast<const uint8_t*>(staged.data());
    EXPECT_EQ(bytes[0], 0x77);
    EXPECT_EQ(bytes[kBytes - 1], 0x77);
  }
  EXPECT_EQ(cudaStreamDestroy(training), cudaSuccess);
}

// Guard: CudaFence::OrderStream's cudaStreamWaitEvent. Training's next
// write, queued while the copy is still queued, runs after the copy read
// the bytes, though the CPU never waited.
TEST_F(CudaBackendSimTest, AFencedStreamOverwritesOnlyAfterTheCopy) {
  std::unique_ptr<Backend> backend = NewBackend();
  Device& device = *backend->devices()[0];
  MemoryBlock on_device = Filled(*backend, device, kBytes, 1);
  MemoryBlock staged = *backend->AllocatePinned(kBytes);
  cudaStream_t training = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&training, cudaStreamNonBlocking),
            cudaSuccess);
  Paused paused({0});
  const CopyOp down{on_device.data(), kBytes, staged.data(), kBytes, kBytes, 1};
  Future<> copied = device.CopyToHost({&down, 1});
  absl::StatusOr<std::shared_ptr<const CopyFence>> fence =
      device.FenceCopiesToHost();
  ASSERT_TRUE(fence.ok()) << fence.status();
  ASSERT_TRUE((*fence)->OrderStream(training).ok());
  ASSERT_EQ(cudaMemsetAsync(on_device.data(), 0, kBytes, training),
            cudaSuccess);
  paused.Resume();
  ASSERT_EQ(cudaStreamSynchronize(training), cudaSuccess);
  ASSERT_TRUE(copied.Wait().ok());
  const auto* bytes = static_cast<const uint8_t*>(staged.data());
  for (int64_t i = 0; i < kBytes; i += 4093) {
    ASSERT_EQ(bytes[i], Byte(i, 1)) << "byte " << i;
  }
  EXPECT_EQ(cudaStreamDestroy(training), cudaSuccess);
}

// Without a driver, or without a device, the backend says so.
TEST_F(CudaBackendSimTest, NoDriverOrNoDeviceIsUnavailable) {
  for (const bool driver : {false, true}) {
    cuda_sim::Config config;
    config.driver = driver;
    config.devices = 0;
    cuda_sim::Reset(config);
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend();
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(backend.status().message(),
                HasSubstr(driver ? "cudaErrorNoDevice"
                                 : "cudaErrorInsufficientDriver"));
  }
}

}  // namespace
}  // namespace hoist
