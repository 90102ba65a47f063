// The simulator's rules (docs/cuda.md lists each with its test), through
// the CUDA runtime API as hoist's backend calls it.
#include "testing/cuda_sim/cuda_sim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace hoist::cuda_sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class CudaSimTest : public ::testing::Test {
 protected:
  // Untimed unless a test says otherwise.
  void SetUp() override { Reset(Untimed()); }
  void TearDown() override { Reset(Untimed()); }

  static Config Untimed() {
    Config config;
    config.device_to_host_bytes_per_s = 0;
    config.host_to_device_bytes_per_s = 0;
    config.seconds_per_copy_call = 0;
    return config;
  }

  static void* DeviceBytes(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return p;
  }
  static uint8_t* PinnedBytes(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), cudaSuccess);
    return static_cast<uint8_t*>(p);
  }
  static cudaStream_t NewStream() {
    cudaStream_t stream = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              cudaSuccess);
    return stream;
  }
  static cudaEvent_t NewEvent() {
    cudaEvent_t event = nullptr;
    EXPECT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
              cudaSuccess);
    return event;
  }
  // kBytes of `byte` on the device, set and observed.
  static void Fill(void* device, uint8_t byte, size_t bytes) {
    ASSERT_EQ(cudaMemset(device, byte, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  static bool All(const uint8_t* p, size_t bytes, uint8_t byte) {
    for (size_t i = 0; i < bytes; ++i) {
      if (p[i] != byte) return false;
    }
    return true;
  }
};

constexpr size_t kBytes = 64 << 10;

// Rule: device memory is the simulator's own; the driver sees devices as
// configured, or none, or no driver.
TEST_F(CudaSimTest, DevicesAndDeviceMemoryAreTheSimulatorsOwn) {
  int count = -1;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(count, 2);
  auto* device = static_cast<uint8_t*>(DeviceBytes(kBytes));
  EXPECT_TRUE(All(device, kBytes, kUninitialized));
  // A host pointer is no device pointer: a copy "from the device" is
  // refused, and freeing memory the simulator never gave is too.
  std::vector<uint8_t> host(kBytes);
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t stream = NewStream();
  EXPECT_EQ(cudaMemcpyAsync(pinned, host.data(), kBytes, cudaMemcpyDeviceToHost,
                            stream),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  // A copy that runs past the end of an allocation.
  EXPECT_EQ(cudaMemcpyAsync(pinned, device + 1, kBytes, cudaMemcpyDeviceToHost,
                            stream),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);

  Config none = Untimed();
  none.devices = 0;
  Reset(none);
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorNoDevice);
  Config no_driver = Untimed();
  no_driver.driver = false;
  Reset(no_driver);
  count = -1;
  EXPECT_EQ(cudaGetDeviceCount(&count), cudaErrorInsufficientDriver);
  EXPECT_EQ(count, -1);  // left unwritten, as cudart does
}

// Rule: a stream is a FIFO run by a thread of its own, later than the call
// that enqueued it; a destination holds poison until completion is observed.
TEST_F(CudaSimTest, StreamRunsLaterAndDestinationIsPoisonUntilObserved) {
  void* device = DeviceBytes(kBytes);
  Fill(device, 0x11, kBytes);
  uint8_t* pinned = PinnedBytes(kBytes);
  std::memset(pinned, 0, kBytes);
  cudaStream_t stream = NewStream();
  cudaEvent_t done = NewEvent();
  Pause(0);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  // Returned, not run: the event is not ready, the bytes are poison.
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  EXPECT_TRUE(All(pinned, kBytes, kPoison));
  Resume(0);
  WaitUntilRun(0);
  // Run, but nobody has observed it: still poison.
  EXPECT_TRUE(All(pinned, kBytes, kPoison));
  EXPECT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_TRUE(All(pinned, kBytes, 0x11));
  EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: a stream runs its operations in the order they were queued.
TEST_F(CudaSimTest, AStreamRunsItsOperationsInOrder) {
  auto* device = static_cast<uint8_t*>(DeviceBytes(kBytes));
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t stream = NewStream();
  Pause(0);
  ASSERT_EQ(cudaMemsetAsync(device, 1, kBytes, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 2, kBytes / 2, stream), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  Resume(0);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(All(pinned, kBytes / 2, 2));
  EXPECT_TRUE(All(pinned + kBytes / 2, kBytes / 2, 1));
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: with pinned host memory a copy is asynchronous; with pageable host
// memory the call returns only once the copy is done (and is counted).
TEST_F(CudaSimTest, PinnedCopiesAreAsynchronousPageableOnesAreNot) {
  void* device = DeviceBytes(kBytes);
  Fill(device, 0x22, kBytes);
  cudaStream_t stream = NewStream();
  cudaEvent_t done = NewEvent();
  uint8_t* pinned = PinnedBytes(kBytes);
  Pause(0);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  Resume(0);
  ASSERT_EQ(cudaEventSynchronize(done), cudaSuccess);
  EXPECT_EQ(CountsOf(0).pageable_copies, 0);

  // Registered memory is pinned too.
  std::vector<uint8_t> registered(kBytes);
  ASSERT_EQ(cudaHostRegister(registered.data(), kBytes, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(registered.data(), device, kBytes,
                            cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(CountsOf(0).pageable_copies, 0);
  ASSERT_EQ(cudaHostUnregister(registered.data()), cudaSuccess);

  // Pageable: done (bytes in place, event complete) when the call returns.
  std::vector<uint8_t> pageable(kBytes, 0);
  ASSERT_EQ(cudaMemcpyAsync(pageable.data(), device, kBytes,
                            cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_TRUE(All(pageable.data(), kBytes, 0x22));
  ASSERT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  EXPECT_EQ(CountsOf(0).pageable_copies, 1);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: cudaStreamWaitEvent orders a stream after another's recorded work;
// without it, touching bytes the other stream's queued copy uses is a
// violation.
TEST_F(CudaSimTest, StreamWaitEventOrdersStreamsAndItsAbsenceIsCaught) {
  void* device = DeviceBytes(kBytes);
  Fill(device, 0x5a, kBytes);
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t copy = NewStream();
  cudaStream_t training = NewStream();
  cudaEvent_t copied = NewEvent();
  Pause(0);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, copy),
      cudaSuccess);
  // Unordered, training's overwrite would race the copy's read.
  EXPECT_EQ(cudaMemsetAsync(device, 0, kBytes, training),
            cudaErrorIllegalState);
  ASSERT_THAT(Violations(), SizeIs(1));
  EXPECT_THAT(Violations()[0], HasSubstr("no event orders the two"));
  // Ordered: the overwrite runs after the copy read the bytes.
  ASSERT_EQ(cudaEventRecord(copied, copy), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(training, copied, 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device, 0, kBytes, training), cudaSuccess);
  Resume(0);
  ASSERT_EQ(cudaStreamSynchronize(training), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(copied), cudaSuccess);
  EXPECT_TRUE(All(pinned, kBytes, 0x5a));
  EXPECT_THAT(Violations(), SizeIs(1));
  EXPECT_EQ(cudaStreamDestroy(copy), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(training), cudaSuccess);
}

// Rule: events record, query and synchronize; an event never recorded is
// complete; an event records on a stream of its own device only.
TEST_F(CudaSimTest, EventsRecordQueryAndSynchronize) {
  cudaEvent_t event = NewEvent();
  EXPECT_EQ(cudaEventQuery(event), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(event), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t other_device = NewStream();
  EXPECT_EQ(cudaEventRecord(event, other_device),
            cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamDestroy(other_device), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event), cudaErrorInvalidResourceHandle);
}

// Rule: cudaHostRegister / cudaHostUnregister errors as documented.
TEST_F(CudaSimTest, HostRegistrationErrorsAreTheDocumentedOnes) {
  std::vector<uint8_t> memory(kBytes);
  ASSERT_EQ(cudaHostRegister(memory.data(), kBytes, 0), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(memory.data(), kBytes, 0),
            cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaHostRegister(memory.data() + 4096, 4096, 0),
            cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaHostUnregister(memory.data() + 4096),
            cudaErrorHostMemoryNotRegistered);
  EXPECT_EQ(cudaHostRegister(nullptr, kBytes, 0), cudaErrorInvalidValue);
  EXPECT_EQ(cudaHostUnregister(memory.data()), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(memory.data()),
            cudaErrorHostMemoryNotRegistered);
  uint8_t* pinned = PinnedBytes(kBytes);
  EXPECT_EQ(cudaHostRegister(pinned, kBytes, 0),
            cudaErrorHostMemoryAlreadyRegistered);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
}

// Rule: freeing or unregistering memory a queued copy still uses fails and
// is recorded; the memory stays valid.
TEST_F(CudaSimTest, FreeingMemoryAQueuedCopyUsesIsAViolation) {
  void* device = DeviceBytes(kBytes);
  std::vector<uint8_t> staging(kBytes);
  ASSERT_EQ(cudaHostRegister(staging.data(), kBytes, 0), cudaSuccess);
  cudaStream_t stream = NewStream();
  Pause(0);
  ASSERT_EQ(cudaMemcpyAsync(staging.data(), device, kBytes,
                            cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(staging.data()), cudaErrorIllegalState);
  EXPECT_EQ(cudaFree(device), cudaErrorIllegalState);
  EXPECT_THAT(Violations(), SizeIs(2));
  Resume(0);
  WaitUntilRun(0);
  // Run but not observed: the copy still writes into the staging memory.
  EXPECT_EQ(cudaHostUnregister(staging.data()), cudaErrorIllegalState);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaHostUnregister(staging.data()), cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  EXPECT_THAT(Violations(), SizeIs(3));
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: invalid arguments fail at the call, queue nothing, and set the
// thread's last error.
TEST_F(CudaSimTest, InvalidArgumentsFailAtTheCall) {
  void* device = DeviceBytes(kBytes);
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t stream = NewStream();
  EXPECT_EQ(cudaMemcpy2DAsync(pinned, 10, device, 100, 20, 4,
                              cudaMemcpyDeviceToHost, stream),
            cudaErrorInvalidPitchValue);
  // The batch calls: not on the legacy stream; every copy attributed.
  void* dsts[] = {pinned};
  const void* srcs[] = {device};
  size_t sizes[] = {kBytes};
  cudaMemcpyAttributes attributes = {};
  size_t index = 0;
  EXPECT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attributes, &index, 1,
                                 stream),
            cudaErrorInvalidValue);  // no source access order
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  EXPECT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attributes, &index, 1,
                                 nullptr),
            cudaErrorInvalidValue);  // the legacy stream
  cudaMemcpy3DBatchOp op = {};
  op.src.type = cudaMemcpyOperandTypePointer;
  op.src.op.ptr.ptr = device;
  op.src.op.ptr.rowLength = 8;
  op.dst.type = cudaMemcpyOperandTypePointer;
  op.dst.op.ptr.ptr = pinned;
  op.extent = {16, 4, 1};
  op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  EXPECT_EQ(cudaMemcpy3DBatchAsync(1, &op, 0, stream),
            cudaErrorInvalidValue);  // a row shorter than the width
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(CountsOf(0).copy_calls, 0);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: an asynchronous error surfaces at the next synchronize that covers
// the failed copy, not at the call; a sticky one then fails every call.
TEST_F(CudaSimTest, AsynchronousErrorsSurfaceAtTheNextSynchronize) {
  void* device = DeviceBytes(kBytes);
  Fill(device, 0x33, kBytes);
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t stream = NewStream();
  FailNextCopy(0, cudaErrorLaunchFailure);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorLaunchFailure);
  EXPECT_TRUE(All(pinned, kBytes, kPoison));  // never written
  // Reported once; the stream goes on.
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(All(pinned, kBytes, 0x33));

  FailNextCopy(0, cudaErrorIllegalAddress, /*sticky=*/true);
  ASSERT_EQ(
      cudaMemcpyAsync(pinned, device, kBytes, cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaMemsetAsync(device, 0, kBytes, stream),
            cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // sticky
  // Another device's context is unharmed.
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_NE(DeviceBytes(16), nullptr);
}

// Rule: an injected synchronous error fails the named call once.
TEST_F(CudaSimTest, InjectedCallErrorFailsTheNamedCallOnce) {
  FailNextCall("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  EXPECT_EQ(Calls("cudaStreamCreateWithFlags"), 2);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: every call counted; per device, copy calls, copies and bytes; the
// timing model's time is latency per call plus bytes over bandwidth.
TEST_F(CudaSimTest, CallsAndCopiesAreCountedAndTimedByTheModel) {
  Config config = Untimed();
  config.device_to_host_bytes_per_s = 1e9;
  config.host_to_device_bytes_per_s = 0.5e9;
  config.seconds_per_copy_call = 1e-5;
  Reset(config);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  auto* device = static_cast<uint8_t*>(DeviceBytes(kBytes));
  uint8_t* pinned = PinnedBytes(kBytes);
  cudaStream_t stream = NewStream();
  void* dsts[] = {pinned, pinned + 4096};
  const void* srcs[] = {device, device + 4096};
  size_t sizes[] = {4096, 4096};
  cudaMemcpyAttributes attributes = {};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t index = 0;
  ASSERT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attributes, &index, 1,
                                 stream),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(device, pinned + 8192, 1000, cudaMemcpyHostToDevice,
                            stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const DeviceCounts counts = CountsOf(1);
  EXPECT_EQ(counts.copy_calls, 2);
  EXPECT_EQ(counts.copies, 3);
  EXPECT_EQ(counts.bytes, 9192);
  EXPECT_NEAR(counts.modelled_seconds, 2e-5 + 8192 / 1e9 + 1000 / 0.5e9, 1e-12);
  EXPECT_EQ(CountsOf(0).copy_calls, 0);
  EXPECT_EQ(Calls("cudaMemcpyBatchAsync"), 1);
  EXPECT_EQ(Calls("cudaMemcpyAsync"), 1);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// Rule: an older driver's answer to the batch calls can be simulated.
TEST_F(CudaSimTest, BatchCallsCanBeUnsupported) {
  Config config = Untimed();
  config.batch_copies = false;
  Reset(config);
  cudaMemcpy3DBatchOp op = {};
  EXPECT_EQ(cudaMemcpy3DBatchAsync(1, &op, 0, nullptr), cudaErrorNotSupported);
  EXPECT_THAT(Violations(), IsEmpty());
}

// Many threads queue and observe at once (TSan's view of the simulator).
TEST_F(CudaSimTest, StreamsOfManyThreadsStayConsistent) {
  constexpr int kThreads = 4;
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &ok] {
      ASSERT_EQ(cudaSetDevice(t % 2), cudaSuccess);
      auto* device = static_cast<uint8_t*>(DeviceBytes(kBytes));
      uint8_t* pinned = PinnedBytes(kBytes);
      cudaStream_t stream = NewStream();
      for (int round = 0; round < 20; ++round) {
        ASSERT_EQ(cudaMemsetAsync(device, round, kBytes, stream), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(pinned, device, kBytes,
                                  cudaMemcpyDeviceToHost, stream),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        ok[t] += All(pinned, kBytes, static_cast<uint8_t>(round));
      }
      ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(ok, ElementsAre(20, 20, 20, 20));
  EXPECT_THAT(Violations(), IsEmpty());
}

}  // namespace
}  // namespace hoist::cuda_sim
