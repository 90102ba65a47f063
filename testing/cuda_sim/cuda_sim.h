// A simulator of the CUDA runtime API: the functions hoist calls, with the
// CUDA programming guide's semantics for what it models, linked instead of
// cudart by a build with -DHOIST_CUDA_SIM=ON (tools/test.sh's builds), so
// that the real CUDA backend runs in every test run on a machine without a
// GPU. docs/cuda.md lists each rule it models with the test that shows it,
// and what only a GPU can prove.
//
// What it models:
//   - devices: Config::devices of them; device memory (cudaMalloc) is memory
//     the simulator owns, filled with kUninitialized;
//   - streams: a FIFO of work per stream, run by a thread of the stream's
//     own, later than the call that enqueued it; the legacy default stream
//     (0) is one more such stream per device;
//   - copies between pinned (cudaHostAlloc, cudaHostRegister) host memory
//     and device memory are asynchronous; with pageable host memory the
//     call returns only once the copy is done;
//   - events: record, query, synchronize, cudaStreamWaitEvent;
//   - cudaHostRegister / cudaHostUnregister errors: double registration
//     (cudaErrorHostMemoryAlreadyRegistered), unknown memory
//     (cudaErrorHostMemoryNotRegistered);
//   - errors: invalid arguments, injected synchronous errors, injected
//     asynchronous copy errors reported at the next synchronize (sticky ones
//     on every later call), the per-thread last error.
//
// Checks a GPU would not make, which catch what a host copy hides:
//   - a copy's destination holds kPoison from the call that enqueues it
//     until its completion is *observed* (an event or stream synchronize or
//     query that covers it): bytes read earlier are poison, however late
//     they are read;
//   - freeing or unregistering memory a queued copy still uses, or queueing
//     a copy that touches bytes another stream's unfinished copy writes
//     (or writes bytes it reads) without an event ordering the two, fails
//     with cudaErrorIllegalState and is recorded in Violations();
//   - every call is counted, per function and per device.
//
// A timing model (bandwidth per direction, a latency per copy call) makes
// a stream take at least the modelled time for its copies; its figures are
// a model, never a GPU's.
//
// Thread-safety: every function here and every CUDA call may be made from
// any thread.
#ifndef HOIST_TESTING_CUDA_SIM_CUDA_SIM_H_
#define HOIST_TESTING_CUDA_SIM_CUDA_SIM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace hoist::cuda_sim {

// The byte a copy's destination holds until its completion is observed.
inline constexpr uint8_t kPoison = 0xDB;
// The byte fresh device memory holds.
inline constexpr uint8_t kUninitialized = 0xDE;

struct Config {
  // Devices visible (HOIST_CUDA_SIM_DEVICES in the environment sets the
  // first configuration's; default 2). 0: cudaGetDeviceCount answers
  // cudaErrorNoDevice.
  int devices = 2;
  // false: no driver; cudaGetDeviceCount answers cudaErrorInsufficientDriver.
  bool driver = true;
  // Per device, what cudaDevAttrHostNumaId answers (default: node 0 for
  // every device; -1 means no NUMA information).
  std::vector<int> host_numa_ids = {};
  // false: cudaMemcpyBatchAsync and cudaMemcpy3DBatchAsync answer
  // cudaErrorNotSupported, as an older driver does (default true).
  bool batch_copies = true;
  // The timing model: bytes per second of each direction (0: untimed) and
  // the time of each call that enqueues copies (PCIe-like defaults).
  double device_to_host_bytes_per_s = 25e9;
  double host_to_device_bytes_per_s = 25e9;
  double seconds_per_copy_call = 10e-6;
};

// Starts afresh with `config`: every stream is drained and stopped, every
// allocation, registration, counter, injected error and violation dropped.
// Memory a caller still holds from before is no longer the simulator's.
void Reset(const Config& config = {});

// Per device: what was asked of it.
struct DeviceCounts {
  int64_t copy_calls = 0;       // calls that enqueue copies (a batch is one)
  int64_t copies = 0;           // copies those calls carried
  int64_t bytes = 0;            // bytes they carried
  int64_t pageable_copies = 0;  // copies with pageable host memory
  double modelled_seconds = 0;  // the timing model's time for them
};
DeviceCounts CountsOf(int device);
// How many times `function` (e.g. "cudaMemcpyBatchAsync") was called.
int64_t Calls(std::string_view function);

// What a real GPU would not report, in order (empty when all went well).
std::vector<std::string> Violations();

// The next call of `function` fails with `error` (before doing anything).
void FailNextCall(std::string_view function, cudaError_t error);
// The next copy that runs on `device` fails with `error`: its destination
// keeps kPoison and the error is returned by the next synchronize or query
// of an event or stream that covers it. Sticky: from then on every call on
// that device returns it, as after a corrupted context.
void FailNextCopy(int device, cudaError_t error, bool sticky = false);

// Holds every stream of `device` before its next operation until
// Resume(device): what is queued stays queued (deterministic tests of
// ordering).
void Pause(int device);
void Resume(int device);
// Waits until every operation queued on `device` so far has run, without
// observing any of them (their destinations still hold kPoison).
void WaitUntilRun(int device);

}  // namespace hoist::cuda_sim

#endif  // HOIST_TESTING_CUDA_SIM_CUDA_SIM_H_
