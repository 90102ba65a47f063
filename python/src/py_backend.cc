#include "py_backend.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_format.h"
#include "hoist/cuda_backend.h"
#include "hoist/host_backend.h"
#include "py_status.h"

namespace nb = nanobind;

namespace hoist {

PyBackend::PyBackend(const std::string& kind, int num_devices,
                     int64_t first_device_id, const std::vector<int>& ordinals)
    : kind_(kind), first_device_id_(first_device_id), ordinals_(ordinals) {
  if (kind == "host") {
    // Host "devices" here hold the caller's own CPU arrays (NumPy, torch,
    // JAX's CPU devices): the cores the devices leave over copy a
    // device's arrays into the pool together (at most 4 per device).
    const int cores =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    backend_ = Check(MakeHostBackend(
        {.num_devices = num_devices,
         .first_device_id = static_cast<DeviceId>(first_device_id),
         .copy_engines = std::clamp(cores / std::max(1, num_devices), 1, 4)}));
  } else if (kind == "cuda") {
    backend_ = Check(MakeCudaBackend(
        {.ordinals = ordinals,
         .first_device_id = static_cast<DeviceId>(first_device_id)}));
  } else {
    Invalid(absl::StrFormat("backend '%s': use 'host' or 'cuda'", kind));
  }
}

int64_t PyBackend::ordinal(int64_t id) const {
  const int64_t at = id - first_device_id_;
  if (at < 0 || at >= static_cast<int64_t>(backend_->devices().size())) {
    return -1;
  }
  return ordinals_.empty() ? at : ordinals_[at];
}

std::vector<int64_t> PyBackend::device_ids() const {
  std::vector<int64_t> ids;
  for (Device* d : backend_->devices()) ids.push_back(d->id());
  return ids;
}

Device* PyBackend::device(int64_t id, const std::string& where) {
  for (Device* d : backend_->devices()) {
    if (d->id() == id) return d;
  }
  Invalid(
      absl::StrFormat("%s: device %d is not one of this backend's", where, id));
  return nullptr;
}

void BindBackend(nb::module_& m) {
  nb::class_<PyBackend>(m, "Backend")
      .def(
          nb::init<const std::string&, int, int64_t, const std::vector<int>&>(),
          nb::arg("kind"), nb::arg("num_devices") = 1,
          nb::arg("first_device_id") = 0,
          nb::arg("ordinals") = std::vector<int>())
      .def("ordinal", &PyBackend::ordinal, nb::arg("device_id"))
      .def_prop_ro("kind", &PyBackend::kind)
      .def("device_ids", &PyBackend::device_ids);
}

}  // namespace hoist
