// Mesh: a named n-d grid of devices, as jax.sharding.Mesh.
#ifndef HOIST_MESH_H_
#define HOIST_MESH_H_

#include <cstdint>
#include <memory>
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
// grid is device_ids()[i]. Immutable value type, thread-compatible; copies
// share one immutable state (a model's thousands of array specs carry one
// mesh of up to thousands of devices, not a copy each).
class Mesh {
 public:
  // Validates and builds a mesh. `device_ids` empty means 0, 1, …, N-1.
  // kInvalidArgument if names are empty or repeated, a size is < 1, the
  // device count does not equal the product of sizes, or a device id is
  // negative or repeated.
  static absl::StatusOr<Mesh> Create(std::vector<std::string> axis_names,
                                     std::vector<int64_t> axis_sizes,
                                     std::vector<DeviceId> device_ids = {});

  int num_axes() const { return static_cast<int>(data_->axis_names.size()); }
  const std::vector<std::string>& axis_names() const {
    return data_->axis_names;
  }
  const std::vector<int64_t>& axis_sizes() const { return data_->axis_sizes; }
  const std::vector<DeviceId>& device_ids() const { return data_->device_ids; }
  int64_t num_devices() const {
    return static_cast<int64_t>(data_->device_ids.size());
  }

  // Index of the axis called `name`, if any.
  std::optional<int> AxisIndex(std::string_view name) const;
  // Grid coordinates of row-major position `position` (< num_devices()).
  std::vector<int64_t> Coords(int64_t position) const;

  // "Mesh(data=2, model=4)".
  std::string ToString() const;

  // Equal axes and devices (copies of one mesh compare at once).
  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.data_ == b.data_ || *a.data_ == *b.data_;
  }

 private:
  struct Data {
    std::vector<std::string> axis_names;
    std::vector<int64_t> axis_sizes;
    std::vector<DeviceId> device_ids;
    friend bool operator==(const Data&, const Data&) = default;
  };
  explicit Mesh(std::shared_ptr<const Data> data) : data_(std::move(data)) {}
  std::shared_ptr<const Data> data_;  // never null
};

}  // namespace hoist

#endif  // HOIST_MESH_H_
