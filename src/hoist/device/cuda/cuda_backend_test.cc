#include "hoist/cuda_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#ifdef HOIST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace hoist {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The backend, or a skip naming why there is none.
#define HOIST_REQUIRE_GPU(backend)                                      \
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(); \
  if (!backend.ok()) GTEST_SKIP() << backend.status().message()

TEST(CudaBackendTest, ReportsUnavailableWithoutDriverOrDeviceAndDoesNotCrash) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend();
  if (backend.ok()) {
    GTEST_SKIP() << "a CUDA device is present; this test is for machines "
                    "without one";
  }
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(backend.status().message()),
              StartsWith("CUDA unavailable: "));
  // Asking again is as safe as the first time.
  EXPECT_EQ(MakeCudaBackend().status().code(), absl::StatusCode::kUnavailable);
}

TEST(CudaBackendTest, ContiguousAndStridedCopiesRoundTripInOneDispatchEach) {
  HOIST_REQUIRE_GPU(backend);
  Device& device = *(*backend)->devices()[0];
  constexpr int64_t kBytes = 1 << 20;
  absl::StatusOr<MemoryBlock> in = (*backend)->AllocatePinned(kBytes);
  absl::StatusOr<MemoryBlock> out = (*backend)->AllocatePinned(kBytes);
  absl::StatusOr<MemoryBlock> on_device = device.Allocate(kBytes);
  ASSERT_TRUE(in.ok() && out.ok() && on_device.ok());
  auto* src = static_cast<uint8_t*>(in->data());
  for (int64_t i = 0; i < kBytes; ++i) src[i] = static_cast<uint8_t>(i * 7);
  const CopyOp up{src, kBytes, on_device->data(), kBytes, kBytes, 1};
  ASSERT_TRUE(device.CopyFromHost({&up, 1}).Wait().ok());

  auto* dst = static_cast<uint8_t*>(out->data());
  std::memset(dst, 0, kBytes);
  const auto* dev = static_cast<const uint8_t*>(on_device->data());
  const CopyOp down[] = {
      {dev, 4096, dst, 4096, 4096, 1},                  // contiguous
      {dev + 8192, 4096, dst + 8192, 4096, 4096, 1},    // contiguous
      {dev + 65536, 1000, dst + 65536, 300, 300, 100},  // strided
  };
  ASSERT_TRUE(device.CopyToHost(down).Wait().ok());
  EXPECT_EQ(std::memcmp(dst, src, 4096), 0);
  EXPECT_EQ(std::memcmp(dst + 8192, src + 8192, 4096), 0);
  for (int r = 0; r < 100; ++r) {
    ASSERT_EQ(std::memcmp(dst + 65536 + r * 300, src + 65536 + r * 1000, 300),
              0)
        << "row " << r;
  }
  EXPECT_EQ(device.counters().dispatches, 2);
  EXPECT_EQ(device.counters().ops, 4);
}

// Both ways of pinning: NUMA-placed (mmap + mbind + cudaHostRegister) and
// cudaHostAlloc, at a size that is not a multiple of the 2 MiB rounding.
TEST(CudaBackendTest, PinnedMemoryEitherWayCopiesBothWays) {
  for (bool numa : {true, false}) {
    absl::StatusOr<std::unique_ptr<Backend>> backend =
        MakeCudaBackend({.numa_placement = numa});
    if (!backend.ok()) GTEST_SKIP() << backend.status().message();
    Device& device = *(*backend)->devices()[0];
    constexpr int64_t kBytes = (int64_t{40} << 20) + 12345;
    absl::StatusOr<MemoryBlock> pinned = (*backend)->AllocatePinned(kBytes);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    absl::StatusOr<MemoryBlock> on_device = device.Allocate(kBytes);
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    auto* host = static_cast<uint8_t*>(pinned->data());
    for (int64_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7);
    const CopyOp up{host, kBytes, on_device->data(), kBytes, kBytes, 1};
    ASSERT_TRUE(device.CopyFromHost({&up, 1}).Wait().ok());
    std::memset(host, 0, kBytes);
    const CopyOp down{on_device->data(), kBytes, host, kBytes, kBytes, 1};
    ASSERT_TRUE(device.CopyToHost({&down, 1}).Wait().ok());
    for (int64_t i = 0; i < kBytes; i += 4099) {
      ASSERT_EQ(host[i], static_cast<uint8_t>(i * 7)) << "numa " << numa;
    }
  }
}

#ifdef HOIST_HAVE_CUDA
// A stream ordered after a fence runs its work only once the fenced copy
// has read the device memory: a memset queued on it right after the copy
// was dispatched (what training's next step would do) never reaches the
// host copy, though the CPU never waited for it.
TEST(CudaBackendTest, StreamOrderedAfterAFenceOverwritesOnlyAfterTheCopy) {
  HOIST_REQUIRE_GPU(backend);
  Device& device = *(*backend)->devices()[0];
  constexpr int64_t kBytes = int64_t{256} << 20;
  absl::StatusOr<MemoryBlock> pinned = (*backend)->AllocatePinned(kBytes);
  absl::StatusOr<MemoryBlock> on_device = device.Allocate(kBytes);
  ASSERT_TRUE(pinned.ok() && on_device.ok());
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // devices()[0]: ordinal 0
  ASSERT_EQ(cudaMemset(on_device->data(), 0x5a, kBytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto* host = static_cast<uint8_t*>(pinned->data());
  std::memset(host, 0, kBytes);
  cudaStream_t training;
  ASSERT_EQ(cudaStreamCreateWithFlags(&training, cudaStreamNonBlocking),
            cudaSuccess);
  const CopyOp down{on_device->data(), kBytes, host, kBytes, kBytes, 1};
  Future<> copied = device.CopyToHost({&down, 1});
  absl::StatusOr<std::shared_ptr<const CopyFence>> fence =
      device.FenceCopiesToHost();
  ASSERT_TRUE(fence.ok()) << fence.status();
  ASSERT_NE(*fence, nullptr);
  ASSERT_NE((*fence)->native_handle(), nullptr);
  ASSERT_TRUE((*fence)->OrderStream(training).ok());
  ASSERT_EQ(cudaMemsetAsync(on_device->data(), 0, kBytes, training),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(training), cudaSuccess);
  ASSERT_TRUE(copied.Wait().ok());
  for (int64_t i = 0; i < kBytes; i += 4093) {
    ASSERT_EQ(host[i], 0x5a) << "byte " << i;
  }
  EXPECT_EQ(host[kBytes - 1], 0x5a);
  cudaStreamDestroy(training);
}
#endif

TEST(CudaBackendTest, MalformedOpFailsWithoutADispatch) {
  HOIST_REQUIRE_GPU(backend);
  Device& device = *(*backend)->devices()[0];
  const CopyOp bad{nullptr, 8, nullptr, 8, 8, 1};
  absl::Status status = device.CopyToHost({&bad, 1}).Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("null pointer"));
  EXPECT_EQ(device.counters().dispatches, 0);
}

TEST(CudaBackendTest, UnknownOrdinalIsInvalidArgument) {
  HOIST_REQUIRE_GPU(backend);
  absl::StatusOr<std::unique_ptr<Backend>> bad =
      MakeCudaBackend({.ordinals = {1 << 20}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hoist
