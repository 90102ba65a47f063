// A Coordinator over a Python object, for the extension module.
#ifndef HOIST_PYTHON_PY_COORDINATOR_H_
#define HOIST_PYTHON_PY_COORDINATOR_H_

#include <nanobind/nanobind.h>

#include <memory>

#include "absl/status/statusor.h"
#include "hoist/coordinator.h"

namespace hoist {

// A Coordinator over `object` (hoist's coordinators over torch.distributed
// and JAX's distributed runtime, or a caller's own): see py_coordinator.cc.
// kInvalidArgument when its `rank` and `size` are not a rank of a job.
absl::StatusOr<std::unique_ptr<Coordinator>> MakePyCoordinator(
    nanobind::object object);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_COORDINATOR_H_
