#include "hoist/sharding.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hoist {
namespace {

std::string SpecToString(const PartitionSpec& spec) {
  std::vector<std::string> entries;
  for (const auto& axes : spec) {
    if (axes.empty()) {
      entries.push_back("None");
    } else if (axes.size() == 1) {
      entries.push_back(absl::StrCat("'", axes[0], "'"));
    } else {
      entries.push_back(absl::StrCat(
          "(",
          absl::StrJoin(axes, ", ",
                        [](std::string* out, const std::string& a) {
                          absl::StrAppend(out, "'", a, "'");
                        }),
          ")"));
    }
  }
  return absl::StrCat("P(", absl::StrJoin(entries, ", "), ")");
}

// Groups per-device shards into unique boxes (sorted), replicas in shard
// order, and assigns replica ids.
ShardLayout GroupReplicas(std::vector<DeviceShard> shards) {
  std::map<Box, std::vector<DeviceId>> groups;
  for (DeviceShard& shard : shards) {
    std::vector<DeviceId>& devices = groups[shard.box];
    shard.replica_id = static_cast<int64_t>(devices.size());
    devices.push_back(shard.device);
  }
  ShardLayout layout;
  layout.shards = std::move(shards);
  for (auto& [box, devices] : groups) {
    if (box.empty()) continue;
    layout.unique_boxes.push_back({box, std::move(devices)});
  }
  return layout;
}

absl::StatusOr<ShardLayout> NamedLayout(const NamedSharding& sharding,
                                        absl::Span<const int64_t> shape) {
  const Mesh& mesh = sharding.mesh;
  const PartitionSpec& spec = sharding.spec;
  const int rank = static_cast<int>(shape.size());
  if (static_cast<int>(spec.size()) > rank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank mismatch: partition spec %s has %d entries but the array %s has "
        "rank %d",
        SpecToString(spec), spec.size(), ShapeToString(shape), rank));
  }
  // For each array dim: the mesh axes partitioning it, and its shard size.
  std::vector<std::vector<int>> dim_axes(rank);
  std::vector<int64_t> shard_shape(shape.begin(), shape.end());
  std::vector<int> axis_dim(mesh.num_axes(), -1);
  for (int d = 0; d < static_cast<int>(spec.size()); ++d) {
    int64_t parts = 1;
    for (const std::string& name : spec[d]) {
      std::optional<int> axis = mesh.AxisIndex(name);
      if (!axis) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "partition spec %s names mesh axis '%s', which %s does not have",
            SpecToString(spec), name, mesh.ToString()));
      }
      if (axis_dim[*axis] >= 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "partition spec %s uses mesh axis '%s' twice (dimensions %d and "
            "%d); each mesh axis may partition at most one dimension",
            SpecToString(spec), name, axis_dim[*axis], d));
      }
      axis_dim[*axis] = d;
      dim_axes[d].push_back(*axis);
      parts *= mesh.axis_sizes()[*axis];
    }
    if (shape[d] % parts != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "dimension %d of array %s has size %d, which is not divisible by "
          "the %d parts of mesh axes (%s) in %s",
          d, ShapeToString(shape), shape[d], parts,
          absl::StrJoin(spec[d], ", "), SpecToString(spec)));
    }
    shard_shape[d] = shape[d] / parts;
  }

  std::vector<DeviceShard> shards;
  shards.reserve(mesh.num_devices());
  for (int64_t position = 0; position < mesh.num_devices(); ++position) {
    const std::vector<int64_t> coords = mesh.Coords(position);
    std::vector<int64_t> origin(rank, 0);
    for (int d = 0; d < rank; ++d) {
      int64_t index = 0;  // mixed radix over the dim's axes, major first
      for (int axis : dim_axes[d]) {
        index = index * mesh.axis_sizes()[axis] + coords[axis];
      }
      origin[d] = index * shard_shape[d];
    }
    shards.push_back(
        {mesh.device_ids()[position], Box(std::move(origin), shard_shape), 0});
  }
  // Mesh order enumerates replicas of a box in the order of the unused axes
  // (row-major), which is JAX's replica_id order.
  return GroupReplicas(std::move(shards));
}

absl::StatusOr<ShardLayout> ExplicitLayout(const ExplicitSharding& sharding,
                                           absl::Span<const int64_t> shape,
                                           int64_t total_elements) {
  const Box whole = Box::FromShape(shape);
  absl::flat_hash_set<DeviceId> seen;
  std::vector<DeviceShard> shards;
  shards.reserve(sharding.shards.size());
  for (const ExplicitShard& shard : sharding.shards) {
    if (!seen.insert(shard.device).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "explicit sharding lists device %d more than once", shard.device));
    }
    if (shard.box.rank() != whole.rank()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank mismatch: box %s of device %d has rank %d but the array %s "
          "has rank %d",
          shard.box.ToString(), shard.device, shard.box.rank(),
          ShapeToString(shape), whole.rank()));
    }
    for (int d = 0; d < whole.rank(); ++d) {
      if (shard.box.origin()[d] < 0 || shard.box.shape()[d] < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("box %s of device %d has a negative origin or size",
                            shard.box.ToString(), shard.device));
      }
    }
    if (!whole.Contains(shard.box)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "box %s of device %d lies outside the array %s", shard.box.ToString(),
          shard.device, ShapeToString(shape)));
    }
    shards.push_back({shard.device, shard.box, 0});
  }
  ShardLayout layout = GroupReplicas(std::move(shards));
  // Distinct boxes must be disjoint; then they tile the array exactly when
  // their element counts add up to the array's.
  const std::vector<UniqueBox>& unique = layout.unique_boxes;
  std::vector<Box> boxes;
  boxes.reserve(unique.size());
  for (const UniqueBox& u : unique) boxes.push_back(u.box);
  absl::StatusOr<std::optional<BoxOverlap>> overlap = FindOverlap(boxes);
  if (!overlap.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("explicit sharding: %s", overlap.status().message()));
  }
  if (*overlap) {
    const UniqueBox& a = unique[(*overlap)->first];
    const UniqueBox& b = unique[(*overlap)->second];
    return absl::InvalidArgumentError(absl::StrFormat(
        "boxes %s (device %d) and %s (device %d) overlap but are not "
        "identical",
        a.box.ToString(), a.devices[0], b.box.ToString(), b.devices[0]));
  }
  // Disjoint boxes inside the array: their sizes add up without overflow.
  int64_t covered = 0;
  for (const Box& box : boxes) covered += box.num_elements();
  if (covered != total_elements) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "explicit sharding leaves a gap: its boxes cover %d of the %d "
        "elements of array %s",
        covered, total_elements, ShapeToString(shape)));
  }
  return layout;
}

}  // namespace

absl::StatusOr<ShardLayout> Sharding::Layout(
    absl::Span<const int64_t> global_shape) const {
  absl::StatusOr<int64_t> total = CheckedNumElements(global_shape);
  if (!total.ok()) return total.status();
  if (const NamedSharding* named = this->named()) {
    return NamedLayout(*named, global_shape);
  }
  if (explicit_shards()->shards.empty()) {
    return absl::InvalidArgumentError("explicit sharding lists no shards");
  }
  return ExplicitLayout(*explicit_shards(), global_shape, *total);
}

std::vector<DeviceId> Sharding::devices() const {
  if (const NamedSharding* named = this->named()) {
    return named->mesh.device_ids();
  }
  std::vector<DeviceId> out;
  for (const ExplicitShard& shard : explicit_shards()->shards) {
    out.push_back(shard.device);
  }
  return out;
}

std::string Sharding::ToString() const {
  if (const NamedSharding* named = this->named()) {
    return absl::StrCat("Named(", named->mesh.ToString(), ", ",
                        SpecToString(named->spec), ")");
  }
  return absl::StrFormat("Explicit(%d shards)",
                         explicit_shards()->shards.size());
}

}  // namespace hoist
