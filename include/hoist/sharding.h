// Sharding: how a global array is laid out across devices.
//
// Two forms:
// - NamedSharding(mesh, spec), as jax.sharding.NamedSharding with a
//   PartitionSpec: each array dimension is unpartitioned or split evenly over
//   one or more mesh axes; mesh axes that no dimension uses replicate.
// - ExplicitSharding: a list of (device, box), as PyTorch DTensor or FSDP
//   shards. Boxes are identical (replicas) or disjoint, and together they
//   cover the array.
// Layout() resolves either form against a global shape, validating it.
#ifndef HOIST_SHARDING_H_
#define HOIST_SHARDING_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/box.h"
#include "hoist/mesh.h"

namespace hoist {

// One entry per leading array dimension: the mesh axes that dimension is
// partitioned over, major to minor; an empty entry leaves it unpartitioned.
// Dimensions past the end of the spec are unpartitioned, as in JAX.
// PartitionSpec{{"data"}, {}} is jax's P("data", None);
// PartitionSpec{{"data", "model"}} is P(("data", "model")).
using PartitionSpec = std::vector<std::vector<std::string>>;

struct NamedSharding {
  Mesh mesh;
  PartitionSpec spec;
  friend bool operator==(const NamedSharding&, const NamedSharding&) = default;
};

struct ExplicitShard {
  DeviceId device;
  Box box;
  friend bool operator==(const ExplicitShard&, const ExplicitShard&) = default;
};

struct ExplicitSharding {
  std::vector<ExplicitShard> shards;
  friend bool operator==(const ExplicitSharding&,
                         const ExplicitSharding&) = default;
};

// What one device holds.
struct DeviceShard {
  DeviceId device;
  Box box;
  // 0 for the first device holding `box`, 1 for the next, … (JAX's
  // Shard.replica_id for named shardings; listing order for explicit ones).
  int64_t replica_id;
  friend bool operator==(const DeviceShard&, const DeviceShard&) = default;
};

// A distinct box and every device holding a copy of it.
struct UniqueBox {
  Box box;
  // devices[r] holds replica r. Never empty.
  std::vector<DeviceId> devices;
  int64_t replicas() const { return static_cast<int64_t>(devices.size()); }
  friend bool operator==(const UniqueBox&, const UniqueBox&) = default;
};

// A sharding resolved against a global shape.
struct ShardLayout {
  // One per device, in mesh (named) or listing (explicit) order.
  std::vector<DeviceShard> shards;
  // Distinct non-empty boxes in Box order; they tile the array exactly once.
  std::vector<UniqueBox> unique_boxes;
};

// Either form. A value type, cheap to copy for the sizes in practice.
class Sharding {
 public:
  Sharding(NamedSharding named) : value_(std::move(named)) {}
  Sharding(ExplicitSharding explicit_shards)
      : value_(std::move(explicit_shards)) {}

  // A named sharding replicating the whole array on every mesh device.
  static Sharding Replicated(Mesh mesh) { return NamedSharding{mesh, {}}; }

  // Resolves against `global_shape`, validating. kInvalidArgument with a
  // message naming the dimension, axis, device or boxes for: a spec longer
  // than the array's rank; an unknown or reused mesh axis; a dimension not
  // divisible by its partition count; an explicit box of the wrong rank,
  // outside the array, or overlapping or leaving a gap with another; a device
  // listed twice; a negative size or an element count overflowing int64_t.
  absl::StatusOr<ShardLayout> Layout(
      absl::Span<const int64_t> global_shape) const;

  // Every device the sharding places data on, in layout order.
  std::vector<DeviceId> devices() const;

  const NamedSharding* named() const {
    return std::get_if<NamedSharding>(&value_);
  }
  const ExplicitSharding* explicit_shards() const {
    return std::get_if<ExplicitSharding>(&value_);
  }

  // "Named(Mesh(data=2, model=4), P(None, 'model'))" or "Explicit(3 shards)".
  std::string ToString() const;

  friend bool operator==(const Sharding&, const Sharding&) = default;

 private:
  std::variant<NamedSharding, ExplicitSharding> value_;
};

}  // namespace hoist

#endif  // HOIST_SHARDING_H_
