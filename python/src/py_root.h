// hoist._hoist's functions of a root or step without a manager (no lock,
// no pool): inspect, verify, read, and the safetensors export and import.
#ifndef HOIST_PYTHON_PY_ROOT_H_
#define HOIST_PYTHON_PY_ROOT_H_

#include <nanobind/nanobind.h>

namespace hoist {

// inspect, inspect_head, verify_at, read_at, export_safetensors,
// import_safetensors, advise_huge_pages, and the defaults Python takes
// from the engine (POOL_ALIGNMENT, IMPORT_POOL_BYTES, EXPORT_*).
void BindRoot(nanobind::module_& m);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_ROOT_H_
