// MakeMpiCoordinator for builds without MPI.
#include "absl/status/status.h"
#include "hoist/coordinator.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<Coordinator>> MakeMpiCoordinator(
    const MpiCoordinatorOptions&) {
  return absl::UnimplementedError(
      "hoist was built without MPI (install libopenmpi-dev and rebuild)");
}

}  // namespace hoist
