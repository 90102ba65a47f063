// Test helper: device memory to restore an array's shards into.
#ifndef HOIST_TESTING_SHARD_BUFFERS_H_
#define HOIST_TESTING_SHARD_BUFFERS_H_

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_types.h"
#include "hoist/device.h"

namespace hoist {

// Device memory for `spec`'s shards on the `devices` it places data on (each
// replica gets its own copy; only the first of each distinct box when
// `one_per_box`, which reads the same extents with less memory), and the
// destinations that fill them.
struct ShardBuffers {
  std::vector<MemoryBlock> memory;
  RestoreTarget target;
};

inline absl::StatusOr<ShardBuffers> AllocateShards(
    const ArraySpec& spec, absl::Span<Device* const> devices,
    bool one_per_box = false) {
  absl::StatusOr<ShardLayout> layout = spec.sharding.Layout(spec.shape);
  if (!layout.ok()) return layout.status();
  ShardBuffers out;
  out.target = {spec.name, spec.dtype, spec.shape, {}};
  std::vector<Box> seen;
  for (const DeviceShard& shard : layout->shards) {
    if (one_per_box) {
      if (std::find(seen.begin(), seen.end(), shard.box) != seen.end()) {
        continue;
      }
      seen.push_back(shard.box);
    }
    for (Device* device : devices) {
      if (device->id() != shard.device) continue;
      absl::StatusOr<MemoryBlock> block =
          device->Allocate(shard.box.num_elements() * ItemSize(spec.dtype));
      if (!block.ok()) return block.status();
      out.target.destinations.push_back({shard.box, device, block->data()});
      out.memory.push_back(*std::move(block));
    }
  }
  return out;
}

}  // namespace hoist

#endif  // HOIST_TESTING_SHARD_BUFFERS_H_
