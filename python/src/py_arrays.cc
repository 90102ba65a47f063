#include "py_arrays.h"

#include <utility>

#include "hoist/dtype.h"
#include "py_observe.h"

namespace hoist {

// (origin, shape) lists from Python as a Box.
Box ToBox(const std::vector<int64_t>& origin, const std::vector<int64_t>& shape,
          const std::string& where) {
  if (origin.size() != shape.size()) {
    Invalid(
        absl::StrFormat("%s: origin and shape of a box differ in rank", where));
  }
  return Box(origin, shape);
}

// `arrays` as restore targets, appended to `targets`: host memory, or the
// device `device_of` gives.
void AppendTargets(const std::vector<PyArray>& arrays, DeviceOfData device_of,
                   std::vector<RestoreTarget>& targets) {
  for (const auto& [name, dtype_name, shape, dests] : arrays) {
    const DType dtype = Check(ParseDType(dtype_name));
    RestoreTarget target{name, dtype, shape, {}};
    for (const auto& [device, origin, box_shape, data] : dests) {
      const std::string where = absl::StrFormat("restore of '%s'", name);
      const Box box = ToBox(origin, box_shape, where);
      void* pointer =
          DenseData(data, box.num_elements() * ItemSize(dtype), where);
      Device* on = nullptr;
      if (data.device_type() != nb::device::cpu::value) {
        on = device_of(device, data, where);
      }
      target.destinations.push_back({box, on, pointer});
    }
    targets.push_back(std::move(target));
  }
}

// A restore's figures as Python's last_restore dict.
nb::dict RestoreStatsDict(const RestoreStats& s) {
  nb::dict d;
  d["bytes_read"] = s.bytes_read;
  d["extents_read"] = s.extents_read;
  d["dispatches"] = s.dispatches;
  d["waves"] = s.waves;
  d["target_bytes"] = s.target_bytes;
  d["elapsed_s"] = absl::ToDoubleSeconds(s.elapsed);
  d["step"] = s.step;
  d["tier"] = TierName(s.restored_from).data();
  d["note"] = s.note;
  d["bytes_received"] = s.bytes_received;
  d["phases"] = PhasesDict(s.phases);
  return d;
}

}  // namespace hoist
