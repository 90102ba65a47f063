#include "hoist/mesh.h"

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hoist/base/checked_math.h"

namespace hoist {

absl::StatusOr<Mesh> Mesh::Create(std::vector<std::string> axis_names,
                                  std::vector<int64_t> axis_sizes,
                                  std::vector<DeviceId> device_ids) {
  if (axis_names.size() != axis_sizes.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("mesh has %d axis names but %d axis sizes",
                        axis_names.size(), axis_sizes.size()));
  }
  absl::flat_hash_set<std::string> seen;
  int64_t count = 1;
  for (size_t i = 0; i < axis_names.size(); ++i) {
    if (axis_names[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mesh axis %d has an empty name", i));
    }
    if (!seen.insert(axis_names[i]).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "mesh axis name '%s' appears more than once", axis_names[i]));
    }
    if (axis_sizes[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mesh axis '%s' has size %d; sizes must be >= 1",
                          axis_names[i], axis_sizes[i]));
    }
    std::optional<int64_t> product = CheckedMul(count, axis_sizes[i]);
    if (!product || *product > (int64_t{1} << 31)) {
      return absl::InvalidArgumentError("mesh has more than 2^31 devices");
    }
    count = *product;
  }
  if (device_ids.empty()) {
    device_ids.resize(count);
    for (int64_t i = 0; i < count; ++i) device_ids[i] = i;
  }
  if (static_cast<int64_t>(device_ids.size()) != count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mesh of shape (%s) needs %d device ids, got %d",
        absl::StrJoin(axis_sizes, ", "), count, device_ids.size()));
  }
  absl::flat_hash_set<DeviceId> seen_devices;
  for (DeviceId id : device_ids) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mesh device id %d is negative", id));
    }
    if (!seen_devices.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("mesh lists device %d more than once", id));
    }
  }
  return Mesh(std::make_shared<const Data>(Data{
      std::move(axis_names), std::move(axis_sizes), std::move(device_ids)}));
}

std::optional<int> Mesh::AxisIndex(std::string_view name) const {
  for (int i = 0; i < num_axes(); ++i) {
    if (axis_names()[i] == name) return i;
  }
  return std::nullopt;
}

std::vector<int64_t> Mesh::Coords(int64_t position) const {
  std::vector<int64_t> coords(num_axes());
  for (int a = num_axes(); a-- > 0;) {
    coords[a] = position % axis_sizes()[a];
    position /= axis_sizes()[a];
  }
  return coords;
}

std::string Mesh::ToString() const {
  std::vector<std::string> axes;
  for (int i = 0; i < num_axes(); ++i) {
    axes.push_back(absl::StrFormat("%s=%d", axis_names()[i], axis_sizes()[i]));
  }
  return absl::StrCat("Mesh(", absl::StrJoin(axes, ", "), ")");
}

}  // namespace hoist
