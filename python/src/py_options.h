// hoist._hoist.ManagerOptions: CheckpointManagerOptions for Python,
// constructed with the C++ defaults (the one source of every default).
#ifndef HOIST_PYTHON_PY_OPTIONS_H_
#define HOIST_PYTHON_PY_OPTIONS_H_

#include <nanobind/nanobind.h>

namespace hoist {

// hoist._hoist.ManagerOptions, with Python's names for the fields.
void BindManagerOptions(nanobind::module_& m);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_OPTIONS_H_
