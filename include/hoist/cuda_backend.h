// The CUDA backend: this process's NVIDIA GPUs as hoist Devices.
//
// Each device has a non-blocking stream for device-to-host copies and one for
// host-to-device copies. A dispatch is one cudaMemcpyBatchAsync for all of
// its contiguous ops plus one cudaMemcpy3DBatchAsync for all of its strided
// (2-D) ops (CUDA >= 12.8; where the runtime is older or the driver answers
// "not supported", a loop of cudaMemcpyAsync / cudaMemcpy2DAsync inside the
// same dispatch), all on the copy stream, followed by an event; a completion
// thread per
// device waits on those events in order and completes the futures (so
// future callbacks run on that device's completion thread, and a failed
// copy's error reaches its future). hoist links the CUDA runtime statically:
// on a machine without a driver the backend reports "CUDA unavailable"
// instead of failing to start.
#ifndef HOIST_CUDA_BACKEND_H_
#define HOIST_CUDA_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/device.h"

namespace hoist {

struct CudaBackendOptions {
  // CUDA device ordinals to drive (default: every visible device).
  std::vector<int> ordinals = {};
  // Global id of the first device; the others follow (default 0).
  DeviceId first_device_id = 0;
  // Per driven device, optionally, the training's compute stream (a
  // cudaStream_t): each dispatch's copies wait for the work queued on it
  // before the dispatch, so staging starts after the last kernel that wrote
  // the arrays. Empty (default): no ordering with other streams.
  std::vector<void*> compute_streams = {};
  // Pinned memory on the host NUMA nodes nearest the devices (mmap + mbind
  // + parallel first touch + cudaHostRegister) where the driver reports them
  // (default true); false, or no NUMA information: cudaHostAlloc.
  bool numa_placement = true;
};

// kUnavailable with "CUDA unavailable: <reason>" when hoist was built
// without CUDA, there is no driver, or no device; kInvalidArgument for an
// ordinal that does not exist.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions& options = {});

}  // namespace hoist

#endif  // HOIST_CUDA_BACKEND_H_
