// MakeCudaBackend for builds without the CUDA toolkit.
#include "absl/status/status.h"
#include "hoist/cuda_backend.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    const CudaBackendOptions&) {
  return absl::UnavailableError(
      "CUDA unavailable: hoist was built without the CUDA toolkit");
}

}  // namespace hoist
