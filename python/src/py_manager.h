// hoist._hoist.Manager and hoist._hoist.SaveHandle: a CheckpointManager
// for Python, which takes each array's shards as the package flattens them
// (python/hoist/_tree.py) and releases the GIL while the engine works.
#ifndef HOIST_PYTHON_PY_MANAGER_H_
#define HOIST_PYTHON_PY_MANAGER_H_

#include <nanobind/nanobind.h>

namespace hoist {

// hoist._hoist.Manager and hoist._hoist.SaveHandle (Backend and
// ManagerOptions must be bound first).
void BindManager(nanobind::module_& m);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_MANAGER_H_
