// The simulator's state (see cuda_sim.h for what it models): devices,
// memory, streams and their threads, events, counters and injected errors,
// all under one mutex. cuda_runtime.cc turns each CUDA call into calls of
// this class; nothing else uses it. sim_runtime.cc holds devices, streams,
// events and the controls; sim_copies.cc memory, the index of which bytes
// queued operations use, and copies.
//
// A stream is a queue of Ops run in order by the stream's thread. A copy
// into host memory runs into a shadow buffer and is *published* (copied to
// its destination) when its completion is observed; until then the
// destination holds kPoison. Sequence numbers order a stream's ops: an
// event is (stream, the sequence number of the stream's last op when it was
// recorded), complete once the stream has run that op.
#ifndef HOIST_TESTING_CUDA_SIM_SIM_RUNTIME_H_
#define HOIST_TESTING_CUDA_SIM_SIM_RUNTIME_H_

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "testing/cuda_sim/cuda_sim.h"

namespace hoist::cuda_sim::internal {

// One 2-D copy (rows of width bytes) or, with src == nullptr, a memset.
struct Piece {
  uint8_t* dst;
  size_t dst_pitch;
  const uint8_t* src;
  size_t src_pitch;
  size_t width;
  size_t rows;
  // The bytes a side touches: [begin, end).
  uintptr_t DstBegin() const { return reinterpret_cast<uintptr_t>(dst); }
  uintptr_t DstEnd() const {
    return DstBegin() + (rows - 1) * dst_pitch + width;
  }
  uintptr_t SrcBegin() const { return reinterpret_cast<uintptr_t>(src); }
  uintptr_t SrcEnd() const {
    return SrcBegin() + (rows - 1) * src_pitch + width;
  }
};

struct StreamState;

// Bytes a queued or unobserved operation reads or writes, indexed by their
// first address (Runtime::uses_), so that a check of a new operation's
// bytes looks only at what lies near them.
struct Use {
  uintptr_t end;
  const StreamState* stream;
  uint64_t seq;
  bool write;
};
using Uses = std::multimap<uintptr_t, Use>;

struct Op {
  enum class Kind { kCopy, kMemset, kWait };
  Kind kind = Kind::kCopy;
  uint64_t seq = 0;
  std::vector<Piece> pieces;  // kCopy, kMemset
  int value = 0;              // kMemset
  bool host_dst = false;      // kCopy into host memory: published later
  double modelled_seconds = 0;
  std::shared_ptr<StreamState> wait_for;  // kWait: until it has run...
  uint64_t wait_seq = 0;                  // ...this op
  std::vector<Uses::iterator> uses;       // its entries in Runtime::uses_
};

// A copy into host memory that has run and waits to be observed.
struct Unpublished {
  uint64_t seq;
  std::vector<Piece> pieces;
  std::vector<uint8_t> shadow;  // the pieces' bytes, row after row
  std::vector<Uses::iterator> writes;
};

struct StreamState {
  uint64_t id = 0;  // never reused
  int device = 0;
  std::string name;
  std::deque<Op> queue;     // not yet run
  std::vector<Op> running;  // the op its thread runs now (0 or 1)
  uint64_t enqueued = 0;    // the last op's sequence number
  uint64_t run = 0;         // the last op run
  std::deque<Unpublished> unpublished;
  cudaError_t error = cudaSuccess;  // an asynchronous error not yet reported
  uint64_t error_seq = 0;
  bool error_sticky = false;
  // Per other stream, the newest op of it this stream waits for (an op
  // queued here after that wait is ordered after it).
  std::map<uint64_t, uint64_t> waits;  // by the other stream's id
  bool stopping = false;
  // The timing model: when this stream's modelled copy engine is free.
  std::chrono::steady_clock::time_point modelled_free;
  std::thread thread;
};

struct EventState {
  int device = 0;
  std::shared_ptr<StreamState> stream;  // null until recorded
  uint64_t seq = 0;
};

// A region of memory the simulator knows.
struct Region {
  enum class Kind { kDevice, kHostAlloc, kRegistered };
  Kind kind;
  uintptr_t begin;
  uintptr_t end;
  int device;  // kDevice
};

// The calling thread's current device (cudaSetDevice) and last error.
inline thread_local int current_device_index = 0;
inline thread_local cudaError_t last_error = cudaSuccess;

class Runtime {
 public:
  static Runtime& Get();

  // The call `function` starts on the current thread: counted; an injected
  // failure or (for a call on the current device's context) the device's
  // sticky error, if any, is returned.
  cudaError_t Enter(const char* function, bool uses_context = true);
  // Returns `error` after recording it as this thread's last error.
  static cudaError_t Fail(cudaError_t error);
  static cudaError_t TakeLastError(bool clear);

  int current_device() const;
  cudaError_t SetDevice(int device);
  cudaError_t DeviceCount(int* count);
  cudaError_t NumaId(int device, int* id);

  // Memory.
  cudaError_t Malloc(void** ptr, size_t bytes);
  cudaError_t Free(void* ptr);
  cudaError_t HostAlloc(void** ptr, size_t bytes);
  cudaError_t FreeHost(void* ptr);
  cudaError_t HostRegister(void* ptr, size_t bytes);
  cudaError_t HostUnregister(void* ptr);

  // Streams and events. A null stream is the current device's legacy one.
  cudaError_t CreateStream(cudaStream_t* stream);
  cudaError_t DestroyStream(cudaStream_t stream);
  cudaError_t CreateEvent(cudaEvent_t* event);
  cudaError_t DestroyEvent(cudaEvent_t event);
  cudaError_t Record(cudaEvent_t event, cudaStream_t stream);
  cudaError_t WaitEvent(cudaStream_t stream, cudaEvent_t event);
  cudaError_t SynchronizeEvent(cudaEvent_t event, bool block);
  cudaError_t SynchronizeStream(cudaStream_t stream);
  cudaError_t SynchronizeDevice();

  // Work. `kind` checks each piece's direction (cudaMemcpyDefault: any of
  // host-to-device, device-to-host, device-to-device).
  cudaError_t Copy(std::vector<Piece> pieces, cudaMemcpyKind kind,
                   cudaStream_t stream, const char* function);
  cudaError_t Memset(void* dst, int value, size_t bytes, cudaStream_t stream,
                     bool synchronous);

  // cuda_sim.h's controls.
  void Reset(const Config& config);
  DeviceCounts CountsOf(int device);
  int64_t Calls(std::string_view function);
  std::vector<std::string> Violations();
  void FailNextCall(std::string_view function, cudaError_t error);
  void FailNextCopy(int device, cudaError_t error, bool sticky);
  void Pause(int device, bool paused);
  void WaitUntilRun(int device);
  bool batch_copies();

 private:
  struct Injected {
    cudaError_t error;
    bool sticky;
  };
  struct DeviceState {
    DeviceCounts counts;
    std::shared_ptr<StreamState> legacy;
    std::deque<Injected> failing_copies;
    cudaError_t sticky = cudaSuccess;
    bool paused = false;
  };

  Runtime();
  using Lock = std::unique_lock<std::mutex>;

  // Malloc and HostAlloc: a region of `kind` (device memory filled with
  // kUninitialized).
  cudaError_t Allocate(void** ptr, size_t bytes, Region::Kind kind);
  // Free, FreeHost and HostUnregister: `ptr` must start a region of
  // `kind` (else `unknown`) that no queued or unobserved copy uses (else a
  // violation: cudaErrorIllegalState).
  cudaError_t Release(void* ptr, Region::Kind kind, cudaError_t unknown,
                      const char* call);
  // The states of `event` and `stream`, or cudaErrorInvalidResourceHandle
  // (or StreamOf's error) for one unknown.
  cudaError_t EventAndStream(cudaEvent_t event, cudaStream_t stream,
                             EventState** event_state,
                             std::shared_ptr<StreamState>* state);
  // The state of `stream` (the legacy stream of the current device, made
  // when first used, for a null one), or null and *error.
  std::shared_ptr<StreamState> StreamOf(cudaStream_t stream,
                                        cudaError_t* error);
  std::shared_ptr<StreamState> StartStream(int device, std::string name);
  void RunStream(StreamState* stream);  // its thread; `stream` outlives it
  void RunOp(StreamState& stream, Op& op, Lock& lock);
  // Queues `op` on `stream`, its bytes tracked in uses_ until it has run
  // (until observed, for the bytes of a copy into host memory).
  void Enqueue(StreamState& stream, Op op);
  void Untrack(std::vector<Uses::iterator>& uses);
  // The use, by a stream `filter` accepts, that overlaps [begin, end); null
  // when none.
  template <typename Filter>
  const Use* FindUse(uintptr_t begin, uintptr_t end, Filter filter) const;
  // The region that holds [begin, end) whole, or null; *partial when one
  // holds part of it only.
  const Region* RegionOf(uintptr_t begin, uintptr_t end, bool* partial) const;
  // The first queued or unpublished copy of another stream, not ordered
  // before `stream`, that overlaps [begin, end) (writing it, or reading it
  // when `write`), described; empty when none.
  std::string Hazard(const StreamState& stream, uintptr_t begin, uintptr_t end,
                     bool write) const;
  std::string UseOf(uintptr_t begin, uintptr_t end) const;  // any stream's
  void Violation(std::string what);
  // Copies `stream`'s run copies up to `seq` to their destinations.
  void Publish(StreamState& stream, uint64_t seq);
  // Publish, then `stream`'s asynchronous error if one happened up to `seq`
  // (reported once; a sticky one then fails every call on its device).
  cudaError_t Observe(StreamState& stream, uint64_t seq);
  void StopAll(Lock& lock);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  Config config_;
  std::vector<DeviceState> devices_;
  std::map<uintptr_t, Region> regions_;  // by begin
  std::map<cudaStream_t, std::shared_ptr<StreamState>> streams_;
  std::map<cudaEvent_t, std::unique_ptr<EventState>> events_;
  std::map<std::string, int64_t, std::less<>> calls_;
  std::map<std::string, std::deque<cudaError_t>, std::less<>> failing_calls_;
  std::vector<std::string> violations_;
  Uses uses_;
  uintptr_t longest_use_ = 0;  // bytes: how far before a query to look
  uint64_t next_handle_ = 1;
};

}  // namespace hoist::cuda_sim::internal

#endif  // HOIST_TESTING_CUDA_SIM_SIM_RUNTIME_H_
