// Mesh: a named n-d grid of devices, as jax.sharding.Mesh.
#ifndef HOIST_MESH_H_
#define HOIST_MESH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hoist {

// A device id is global across every process of a job (jax.Device.id, or the
// global rank * devices-per-rank + local index for PyTorch).
using DeviceId = int64_t;

// A grid of devices with named axes. Device at row-major position i of the
// grid is device_ids()[i]. Immutable value type, thread-compatible.
class Mesh {
 public:
  // Validates and builds a mesh. `device_ids` empty means 0, 1, …, N-1.
  // kInvalidArgument if names are empty or repeated, a size is < 1, the
  // device count does not equal the product of sizes, or a device id is
  // negative or repeated.
  static absl::StatusOr<Mesh> Create(std::vector<std::string> axis_names,
                                     std::vector<int64_t> axis_sizes,
                                     std::vector<DeviceId> device_ids = {});

  int num_axes() const { return static_cast<int>(axis_names_.size()); }
  const std::vector<std::string>& axis_names() const { return axis_names_; }
  const std::vector<int64_t>& axis_sizes() const { return axis_sizes_; }
  const std::vector<DeviceId>& device_ids() const { return device_ids_; }
  int64_t num_devices() const {
    return static_cast<int64_t>(device_ids_.size());
  }

  // Index of the axis called `name`, if any.
  std::optional<int> AxisIndex(std::string_view name) const;
  // Grid coordinates of row-major position `position` (< num_devices()).
  std::vector<int64_t> Coords(int64_t position) const;

  // "Mesh(data=2, model=4)".
  std::string ToString() const;

  friend bool operator==(const Mesh&, const Mesh&) = default;

 private:
  Mesh() = default;
  std::vector<std::string> axis_names_;
  std::vector<int64_t> axis_sizes_;
  std::vector<DeviceId> device_ids_;
};

}  // namespace hoist

#endif  // HOIST_MESH_H_
