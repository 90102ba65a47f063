// hoist._hoist.Backend: this process's devices (host or CUDA), which a
// manager stages from and restores into.
#ifndef HOIST_PYTHON_PY_BACKEND_H_
#define HOIST_PYTHON_PY_BACKEND_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hoist/device.h"

namespace hoist {

// This process's devices. In a job of several processes every device has a
// job-wide id: `first_device_id` is this process's first (the others follow
// in order); `ordinals` picks the CUDA devices to drive (default all).
// `kind`: "host" or "cuda" (else ValueError). Used with the GIL held.
class PyBackend {
 public:
  PyBackend(const std::string& kind, int num_devices, int64_t first_device_id,
            const std::vector<int>& ordinals);

  Backend& get() { return *backend_; }
  const std::string& kind() const { return kind_; }
  // The CUDA ordinal of the device with job-wide id `id` (-1: not ours).
  int64_t ordinal(int64_t id) const;
  std::vector<int64_t> device_ids() const;
  // The device with job-wide id `id`; ValueError naming `where` if none.
  Device* device(int64_t id, const std::string& where);

 private:
  std::string kind_;
  int64_t first_device_id_;
  std::vector<int> ordinals_;
  std::unique_ptr<Backend> backend_;
};

// hoist._hoist.Backend.
void BindBackend(nanobind::module_& m);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_BACKEND_H_
