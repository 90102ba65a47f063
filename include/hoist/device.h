// The device boundary: what hoist needs from an accelerator runtime.
//
// A Backend owns a process's local Devices and allocates the pinned host
// memory the staging pool lives in. A Device moves bytes between its memory
// and host memory through its copy queue: CopyToHost / CopyFromHost enqueue
// every op they are given as ONE dispatch and return at once; the returned
// future completes when every byte of the dispatch has landed, or with the
// error that stopped it. Dispatches on one device's queue run in order.
//
// Memory handed to a dispatch (sources and destinations) must stay valid and
// unmodified by the caller until its future completes. The `ops` span itself
// may be destroyed as soon as the call returns.
#ifndef HOIST_DEVICE_H_
#define HOIST_DEVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/future.h"
#include "hoist/mesh.h"

namespace hoist {

// One 2-D copy: `rows` rows of `width_bytes`; row r is read at
// src + r * src_pitch and written at dst + r * dst_pitch. A slice of an array
// along any one axis is one CopyOp. A contiguous copy has rows == 1.
// Ops with width_bytes == 0 or rows == 0 copy nothing and are dropped.
struct CopyOp {
  const void* src = nullptr;
  int64_t src_pitch = 0;
  void* dst = nullptr;
  int64_t dst_pitch = 0;
  int64_t width_bytes = 0;
  int64_t rows = 1;

  int64_t bytes() const { return width_bytes * rows; }
};

// Copies a device checked and arranged once (Device::PrepareCopiesToHost),
// to dispatch again and again: a save of arrays that stay where they are
// copies the same bytes into the same staging memory save after save.
class PreparedCopies {
 public:
  virtual ~PreparedCopies() = default;
};

// Cumulative per-device counters since the device was created.
struct DeviceCounters {
  int64_t dispatches = 0;  // CopyToHost + CopyFromHost calls with work
  int64_t ops = 0;         // CopyOps executed
  int64_t bytes = 0;       // bytes copied, both directions
  int64_t busy_ns = 0;     // time copy engines spent copying, summed
};

// A block of memory owned by a backend (device memory, or pinned host
// memory). Move-only; frees itself on destruction.
class MemoryBlock {
 public:
  MemoryBlock() = default;
  MemoryBlock(void* data, int64_t size_bytes,
              std::function<void(void*, int64_t)> free)
      : data_(data), size_bytes_(size_bytes), free_(std::move(free)) {}
  MemoryBlock(MemoryBlock&& other) noexcept { *this = std::move(other); }
  MemoryBlock& operator=(MemoryBlock&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_bytes_ = std::exchange(other.size_bytes_, 0);
      free_ = std::move(other.free_);
    }
    return *this;
  }
  MemoryBlock(const MemoryBlock&) = delete;
  MemoryBlock& operator=(const MemoryBlock&) = delete;
  ~MemoryBlock() { Reset(); }

  void* data() const { return data_; }
  int64_t size_bytes() const { return size_bytes_; }

 private:
  void Reset() {
    if (data_ != nullptr && free_) free_(data_, size_bytes_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  int64_t size_bytes_ = 0;
  std::function<void(void*, int64_t)> free_;
};

// A point in one device's device-to-host copy queue, for backends whose
// devices order work among their own streams (CUDA): it is passed once every
// copy dispatched to that queue before the fence was made has finished
// reading device memory. Destroying it never waits.
class CopyFence {
 public:
  virtual ~CopyFence() = default;
  // The native handle: a cudaEvent_t for the CUDA backend.
  virtual void* native_handle() const = 0;
  // Makes `stream` (a cudaStream_t; nullptr: the legacy default stream) wait,
  // on the device, for the fenced copies: work queued on it afterwards runs
  // after them. Returns at once, without waiting on the CPU.
  virtual absl::Status OrderStream(void* stream) const = 0;
};

// One accelerator (or, for the host backend, one logical device). Methods are
// thread-safe.
class Device {
 public:
  virtual ~Device() = default;

  // The global device id (as in a Mesh).
  virtual DeviceId id() const = 0;

  // Enqueues all `ops` (device memory -> host memory) as one dispatch and
  // returns at once. The future completes with OK when every byte has
  // landed, or with the error (kInvalidArgument for a malformed op, kInternal
  // for a failed copy). An empty `ops` completes at once without a dispatch.
  virtual Future<> CopyToHost(absl::Span<const CopyOp> ops) = 0;
  // Checks `ops` (device memory -> host memory) and arranges them for
  // CopyPreparedToHost, which dispatches them as CopyToHost(ops) would, at
  // a cost that does not grow with the ops. Their memory must be valid at
  // each dispatch, not now. kInvalidArgument for a malformed op (as
  // CopyToHost's). Default: keeps the ops for CopyToHost. A backend
  // overrides both calls or neither.
  virtual absl::StatusOr<std::shared_ptr<const PreparedCopies>>
  PrepareCopiesToHost(absl::Span<const CopyOp> ops) {
    return std::make_shared<const KeptOps>(ops);
  }
  // Dispatches copies this device prepared, as CopyToHost does (the
  // device may keep `copies` until they are done).
  virtual Future<> CopyPreparedToHost(
      std::shared_ptr<const PreparedCopies> copies) {
    return CopyToHost(static_cast<const KeptOps&>(*copies).ops);
  }
  // Copies enqueued between HoldCopies() and ReleaseCopies() may wait for
  // the release to start, so that a dispatcher enqueuing on every device in
  // turn is not slowed by the first devices' copies (the host backend's,
  // which run on the CPU the dispatcher needs). Default: nothing is held.
  virtual void HoldCopies() {}
  virtual void ReleaseCopies() {}

  // The same, host memory -> device memory.
  virtual Future<> CopyFromHost(absl::Span<const CopyOp> ops) = 0;

  // Allocates `bytes` of device memory (64-byte aligned at least).
  // kResourceExhausted when the device is out of memory.
  virtual absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) = 0;

  virtual DeviceCounters counters() const = 0;

  // A fence after every CopyToHost dispatched so far, or nullptr where the
  // device has no queue another stream can wait on (the host backend, whose
  // copies the CPU waits for).
  virtual absl::StatusOr<std::shared_ptr<const CopyFence>> FenceCopiesToHost() {
    return nullptr;
  }

 private:
  // The default PreparedCopies: the ops as given.
  struct KeptOps final : PreparedCopies {
    explicit KeptOps(absl::Span<const CopyOp> given)
        : ops(given.begin(), given.end()) {}
    std::vector<CopyOp> ops;
  };
};

// Every lease of a staging pool (the pinned memory AllocatePinned gives,
// which the engine hands out in pieces) starts at a multiple of this, so a
// staged slice can be written with O_DIRECT as it lies; a client sizing a
// pool for several slices rounds each up to it.
inline constexpr int64_t kPoolAlignmentBytes = 4096;

// A process's devices and its pinned host memory. Thread-safe.
class Backend {
 public:
  virtual ~Backend() = default;

  // "host", "cuda".
  virtual std::string_view name() const = 0;

  // This process's devices, in local order. They live as long as the backend.
  virtual absl::Span<Device* const> devices() const = 0;

  // Allocates `bytes` of page-aligned host memory that the devices copy to
  // and from at full speed (pinned / page-locked where the platform allows),
  // pre-faulted so the first copy into it pays no page faults. Called once
  // per staging pool, never on the save path. kResourceExhausted when the
  // memory cannot be had.
  virtual absl::StatusOr<MemoryBlock> AllocatePinned(int64_t bytes) = 0;

  // Allocates `bytes` of page-aligned host memory for the overflow of a
  // save larger than the staging pool (CheckpointManagerOptions::
  // host_memory_budget): memory the devices copy into without serializing
  // their dispatches, faulted in by the first copy that lands in it where
  // the platform allows. Called when a save needs more of it than it has
  // (once per job, unless the saves grow), never for every save. Default:
  // AllocatePinned (a CUDA copy into pageable memory returns only once it
  // has finished, so the devices' dispatches would run one after another).
  // The host backend's is plain pageable memory. Errors: as AllocatePinned.
  virtual absl::StatusOr<MemoryBlock> AllocateOverflow(int64_t bytes) {
    return AllocatePinned(bytes);
  }
};

}  // namespace hoist

#endif  // HOIST_DEVICE_H_
