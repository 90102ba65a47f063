// The CUDA backend (see include/hoist/cuda_backend.h for the contract).
//
// A dispatch, on the calling thread: cudaSetDevice; make the copy stream
// wait on an event recorded on the compute stream (when one was given); one
// cudaMemcpyBatchAsync carrying every contiguous op and one
// cudaMemcpy3DBatchAsync carrying every strided (2-D) op (CUDA 12.8 and
// later; before, or where the driver does not support them, a loop of
// cudaMemcpyAsync / cudaMemcpy2DAsync in the same dispatch); record a
// completion event; hand (event, promise) to the device's completion thread,
// which cudaEventSynchronize()s events in order and completes each promise
// with the result, so an asynchronous copy failure reaches the future (the
// futures complete on that thread). Every CUDA call's result is checked and
// named.
//
// Pinned memory: where the driver reports the devices' host NUMA nodes
// (cudaDevAttrHostNumaId), the pool is mmap'd, bound to those nodes (mbind:
// preferred for one node, interleaved over several), faulted in by parallel
// threads and registered with cudaHostRegister; otherwise cudaHostAlloc.
#include "hoist/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/device/copy_op.h"
#include "hoist/huge_pages.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

absl::Status CudaStatus(cudaError_t error, const char* call) {
  const std::string message = absl::StrFormat(
      "%s: %s (%s)", call, cudaGetErrorString(error), cudaGetErrorName(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

#define HOIST_CUDA_RETURN_IF_ERROR(call)                      \
  do {                                                        \
    if (cudaError_t error_ = (call); error_ != cudaSuccess) { \
      return CudaStatus(error_, #call);                       \
    }                                                         \
  } while (0)

// A batch call the driver cannot do: fall back to one call per op (and
// clear the sticky last error the failed call left).
bool BatchUnsupported(cudaError_t error) {
  if (error != cudaErrorNotSupported &&
      error != cudaErrorCallRequiresNewerDriver) {
    return false;
  }
  (void)cudaGetLastError();
  return true;
}

// A cudaEvent_t recorded on a device's copy stream.
class CudaFence final : public CopyFence {
 public:
  explicit CudaFence(cudaEvent_t event) : event_(event) {}
  ~CudaFence() override { cudaEventDestroy(event_); }
  void* native_handle() const override { return event_; }
  absl::Status OrderStream(void* stream) const override {
    HOIST_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0));
    return absl::OkStatus();
  }

 private:
  const cudaEvent_t event_;
};

class CudaDevice final : public Device {
 public:
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(
      DeviceId id, int ordinal, cudaStream_t compute) {
    HOIST_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    cudaStream_t d2h = nullptr, h2d = nullptr;
    HOIST_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&d2h, cudaStreamNonBlocking));
    HOIST_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&h2d, cudaStreamNonBlocking));
    return std::unique_ptr<CudaDevice>(
        new CudaDevice(id, ordinal, d2h, h2d, compute));
  }

  ~CudaDevice() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    completer_.join();  // drains every pending completion first
    cudaSetDevice(ordinal_);
    cudaStreamDestroy(d2h_);
    cudaStreamDestroy(h2d_);
  }

  DeviceId id() const override { return id_; }

  Future<> CopyToHost(absl::Span<const CopyOp> ops) override {
    return Dispatch(ops, d2h_, cudaMemcpyDeviceToHost);
  }
  Future<> CopyFromHost(absl::Span<const CopyOp> ops) override {
    return Dispatch(ops, h2d_, cudaMemcpyHostToDevice);
  }

  absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("device %d: cannot allocate %d bytes", id_, bytes));
    }
    HOIST_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    void* data = nullptr;
    HOIST_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, std::max<int64_t>(bytes, 1)));
    const int ordinal = ordinal_;
    return MemoryBlock(data, bytes, [ordinal](void* p, int64_t) {
      cudaSetDevice(ordinal);
      cudaFree(p);
    });
  }

  DeviceCounters counters() const override { return counters_.Snapshot(); }

  absl::StatusOr<std::shared_ptr<const CopyFence>> FenceCopiesToHost()
      override {
    HOIST_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t event;
    HOIST_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    auto fence = std::make_shared<const CudaFence>(event);
    HOIST_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, d2h_));
    return fence;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Promise<> promise;
    absl::Time dispatched;
  };

  CudaDevice(DeviceId id, int ordinal, cudaStream_t d2h, cudaStream_t h2d,
             cudaStream_t compute)
      : id_(id), ordinal_(ordinal), d2h_(d2h), h2d_(h2d), compute_(compute) {
    completer_ = std::thread([this] { CompleteLoop(); });
  }

  Future<> Dispatch(absl::Span<const CopyOp> ops, cudaStream_t stream,
                    cudaMemcpyKind kind) {
    absl::StatusOr<std::vector<CopyOp>> normalized = NormalizeCopyOps(ops);
    if (!normalized.ok()) return Future<>::Ready(normalized.status());
    if (normalized->empty()) return Future<>::Ready(absl::OkStatus());
    Pending pending;
    pending.dispatched = absl::Now();
    Future<> future = pending.promise.future();
    absl::Status status = Enqueue(*normalized, stream, kind, &pending.event);
    if (!status.ok()) {
      return Future<>::Ready(absl::Status(
          status.code(),
          absl::StrFormat("device %d: %s", id_, status.message())));
    }
    counters_.AddDispatch(*normalized);
    MutexLock lock(&mu_);
    pending_.push_back(std::move(pending));
    return future;
  }

  absl::Status Enqueue(const std::vector<CopyOp>& ops, cudaStream_t stream,
                       cudaMemcpyKind kind, cudaEvent_t* done) {
    HOIST_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    if (compute_ != nullptr) {
      cudaEvent_t ready;
      HOIST_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      HOIST_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready, compute_));
      HOIST_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, ready, 0));
      HOIST_CUDA_RETURN_IF_ERROR(cudaEventDestroy(ready));
    }
    std::vector<const CopyOp*> flat, strided;
    for (const CopyOp& op : ops) (op.rows == 1 ? flat : strided).push_back(&op);
    RETURN_IF_ERROR(EnqueueContiguous(flat, stream, kind));
    RETURN_IF_ERROR(EnqueueStrided(strided, stream, kind));
    HOIST_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
        done, cudaEventDisableTiming | cudaEventBlockingSync));
    HOIST_CUDA_RETURN_IF_ERROR(cudaEventRecord(*done, stream));
    return absl::OkStatus();
  }

  // Every contiguous op: one cudaMemcpyBatchAsync.
  absl::Status EnqueueContiguous(const std::vector<const CopyOp*>& ops,
                                 cudaStream_t stream, cudaMemcpyKind kind) {
    if (ops.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 12080
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const CopyOp* op : ops) {
      dsts.push_back(op->dst);
      srcs.push_back(op->src);
      sizes.push_back(static_cast<size_t>(op->width_bytes));
    }
    cudaMemcpyAttributes attributes = {};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attribute_index = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t error = cudaMemcpyBatchAsync(
        dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes,
        &attribute_index, 1, stream);
#else
    size_t fail_index = 0;
    const cudaError_t error = cudaMemcpyBatchAsync(
        dsts.data(), const_cast<void**>(srcs.data()), sizes.data(), dsts.size(),
        &attributes, &attribute_index, 1, &fail_index, stream);
#endif
    if (!BatchUnsupported(error)) {
      if (error != cudaSuccess) {
        return CudaStatus(error, "cudaMemcpyBatchAsync");
      }
      return absl::OkStatus();
    }
#endif
    for (const CopyOp* op : ops) {
      HOIST_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(op->dst, op->src,
                          static_cast<size_t>(op->width_bytes), kind, stream));
    }
    return absl::OkStatus();
  }

  // Every strided op (rows x width, pitched): one cudaMemcpy3DBatchAsync,
  // each op a pointer-to-pointer copy of depth 1 whose "elements" are bytes.
  absl::Status EnqueueStrided(const std::vector<const CopyOp*>& ops,
                              cudaStream_t stream, cudaMemcpyKind kind) {
    if (ops.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 12080
    std::vector<cudaMemcpy3DBatchOp> batch(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const CopyOp& op = *ops[i];
      cudaMemcpy3DBatchOp& b = batch[i];
      b = {};
      b.src.type = cudaMemcpyOperandTypePointer;
      b.src.op.ptr.ptr = const_cast<void*>(op.src);
      b.src.op.ptr.rowLength = static_cast<size_t>(op.src_pitch);
      b.dst.type = cudaMemcpyOperandTypePointer;
      b.dst.op.ptr.ptr = op.dst;
      b.dst.op.ptr.rowLength = static_cast<size_t>(op.dst_pitch);
      b.extent.width = static_cast<size_t>(op.width_bytes);
      b.extent.height = static_cast<size_t>(op.rows);
      b.extent.depth = 1;
      b.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      b.flags = 0;
    }
#if CUDART_VERSION >= 13000
    const cudaError_t error =
        cudaMemcpy3DBatchAsync(batch.size(), batch.data(), 0, stream);
#else
    size_t fail_index = 0;
    const cudaError_t error = cudaMemcpy3DBatchAsync(batch.size(), batch.data(),
                                                     &fail_index, 0, stream);
#endif
    if (!BatchUnsupported(error)) {
      if (error != cudaSuccess) {
        return CudaStatus(error, "cudaMemcpy3DBatchAsync");
      }
      return absl::OkStatus();
    }
#endif
    for (const CopyOp* op : ops) {
      HOIST_CUDA_RETURN_IF_ERROR(
          cudaMemcpy2DAsync(op->dst, static_cast<size_t>(op->dst_pitch),
                            op->src, static_cast<size_t>(op->src_pitch),
                            static_cast<size_t>(op->width_bytes),
                            static_cast<size_t>(op->rows), kind, stream));
    }
    return absl::OkStatus();
  }

  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !pending_.empty();
  }

  // Completes dispatches in order, on this device's completion thread.
  void CompleteLoop() {
    while (true) {
      Pending pending;
      {
        MutexLock lock(&mu_);
        mu_.Await(Condition(this, &CudaDevice::HasWorkOrStopping));
        if (pending_.empty()) return;
        pending = std::move(pending_.front());
        pending_.pop_front();
      }
      cudaSetDevice(ordinal_);
      const cudaError_t error = cudaEventSynchronize(pending.event);
      cudaEventDestroy(pending.event);
      counters_.AddBusy(absl::Now() - pending.dispatched);
      pending.promise.Set(
          error == cudaSuccess
              ? absl::OkStatus()
              : CudaStatus(error, "cudaEventSynchronize(copy completion)"));
    }
  }

  const DeviceId id_;
  const int ordinal_;
  const cudaStream_t d2h_;
  const cudaStream_t h2d_;
  const cudaStream_t compute_;
  Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  AtomicDeviceCounters counters_;
  std::thread completer_;
};

// Faults in every page of [data, data + bytes) from `threads` threads, so
// that the pages come from the memory policy's nodes in parallel.
void TouchInParallel(uint8_t* data, int64_t bytes) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int threads = static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(std::thread::hardware_concurrency(), 16), 1,
      std::max<int64_t>(1, bytes >> 26)));  // a thread per 64 MiB, up to 16
  const int64_t chunk = (bytes / threads + page - 1) / page * page;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([=] {
      const int64_t begin = t * chunk;
      const int64_t end = std::min(bytes, begin + chunk);
      for (int64_t at = begin; at < end; at += page) data[at] = 0;
    });
  }
  for (std::thread& w : workers) w.join();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::vector<std::unique_ptr<CudaDevice>> devices,
              std::vector<int> numa_nodes)
      : owned_(std::move(devices)), numa_nodes_(std::move(numa_nodes)) {
    for (auto& device : owned_) devices_.push_back(device.get());
  }
  // Figures of a build linked with the simulator (testing/cuda_sim) are
  // the simulator's, never a GPU's: its name says so wherever it is shown.
#ifdef HOIST_CUDA_SIM
  std::string_view name() const override { return "cuda-sim"; }
#else
  std::string_view name() const override { return "cuda"; }
#endif
  absl::Span<Device* const> devices() const override { return devices_; }

  absl::StatusOr<MemoryBlock> AllocatePinned(int64_t bytes) override {
    if (bytes <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pinned allocation of %d bytes: size must be > 0", bytes));
    }
    if (numa_nodes_.empty()) {
      void* data = nullptr;
      HOIST_CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(&data, bytes, cudaHostAllocPortable));
      return MemoryBlock(data, bytes,
                         [](void* p, int64_t) { cudaFreeHost(p); });
    }
    // On the devices' NUMA nodes: map, bind, fault in, register.
    const int64_t size =
        (bytes + (int64_t{2} << 20) - 1) & ~((int64_t{2} << 20) - 1);
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("pinned allocation of %d bytes: mmap failed", bytes));
    }
    AdviseHugePagesForIo(data, size);
    constexpr int kMaskBits = 1024;
    unsigned long mask[kMaskBits / (8 * sizeof(unsigned long))] = {};
    for (int node : numa_nodes_) {
      if (node < kMaskBits) {
        mask[node / (8 * sizeof(unsigned long))] |=
            1ul << (node % (8 * sizeof(unsigned long)));
      }
    }
    // Best effort: without it the pages land where the touching threads run.
    (void)syscall(SYS_mbind, data, size,
                  numa_nodes_.size() == 1 ? MPOL_PREFERRED : MPOL_INTERLEAVE,
                  mask, kMaskBits + 1, 0);
    TouchInParallel(static_cast<uint8_t*>(data), size);
    if (const cudaError_t error =
            cudaHostRegister(data, size, cudaHostRegisterPortable);
        error != cudaSuccess) {
      munmap(data, size);
      return CudaStatus(error, "cudaHostRegister(staging pool)");
    }
    return MemoryBlock(data, bytes, [size](void* p, int64_t) {
      cudaHostUnregister(p);
      munmap(p, size);
    });
  }

 private:
  std::vector<std::unique_ptr<CudaDevice>> owned_;
  const std::vector<int> numa_nodes_;  // host nodes near the devices
  std::vector<Device*> devices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options) {
  // Without a driver cudaGetDeviceCount fails (cudaErrorInsufficientDriver)
  // and leaves the count unwritten: read it only on success.
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count);
      error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrFormat("CUDA unavailable: cudaGetDeviceCount: %s (%s)",
                        cudaGetErrorString(error), cudaGetErrorName(error)));
  }
  if (count == 0) {
    return absl::UnavailableError("CUDA unavailable: no CUDA devices");
  }
  std::vector<int> ordinals = options.ordinals;
  if (ordinals.empty()) {
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  }
  if (!options.compute_streams.empty() &&
      options.compute_streams.size() != ordinals.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d compute streams given for %d devices",
                        options.compute_streams.size(), ordinals.size()));
  }
  std::vector<std::unique_ptr<CudaDevice>> devices;
  std::vector<int> numa_nodes;
  for (size_t i = 0; i < ordinals.size(); ++i) {
    if (ordinals[i] < 0 || ordinals[i] >= count) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "CUDA device %d does not exist (%d visible)", ordinals[i], count));
    }
    cudaStream_t compute =
        options.compute_streams.empty()
            ? nullptr
            : static_cast<cudaStream_t>(options.compute_streams[i]);
    absl::StatusOr<std::unique_ptr<CudaDevice>> device =
        CudaDevice::Create(options.first_device_id + static_cast<DeviceId>(i),
                           ordinals[i], compute);
    if (!device.ok()) return device.status();
    devices.push_back(*std::move(device));
    // The host NUMA node nearest the device, where the driver knows it
    // (CUDA 12.2+); -1 or an error means no NUMA placement.
    int node = -1;
    if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, ordinals[i]) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      node = -1;
    }
    if (node >= 0 && std::find(numa_nodes.begin(), numa_nodes.end(), node) ==
                         numa_nodes.end()) {
      numa_nodes.push_back(node);
    }
  }
  if (!options.numa_placement) numa_nodes.clear();
  return std::make_unique<CudaBackend>(std::move(devices),
                                       std::move(numa_nodes));
}

}  // namespace hoist
