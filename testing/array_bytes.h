// Test helpers: deterministic array contents, and device shards holding them.
#ifndef HOIST_TESTING_ARRAY_BYTES_H_
#define HOIST_TESTING_ARRAY_BYTES_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "hoist/array_spec.h"
#include "hoist/device.h"
#include "hoist/transfer/transfer_engine.h"
#include "testing/coverage.h"

namespace hoist::testing {

// The bytes of element `flat` of array number `array` (salted by `version`,
// so two saves of the same arrays differ): a byte copied to the wrong place,
// from the wrong array or from the wrong step shows.
inline void ElementBytes(int array, int64_t flat, int64_t item, uint8_t* out,
                         uint64_t version = 0) {
  uint64_t v = (static_cast<uint64_t>(array) + 1) * 0x9E3779B97F4A7C15ull ^
               (static_cast<uint64_t>(flat) * 0xBF58476D1CE4E5B9ull) ^
               (version * 0x94D049BB133111EBull);
  v ^= v >> 29;
  std::memcpy(out, &v, item);
}

// The dense C-order bytes of `box` of array `array`.
inline std::vector<uint8_t> BoxBytes(const ArraySpec& spec, int array,
                                     const Box& box, uint64_t version = 0) {
  const int64_t item = ItemSize(spec.dtype);
  std::vector<uint8_t> bytes(box.num_elements() * item);
  uint8_t* out = bytes.data();
  ForEachIndex(box, spec.shape, [&](int64_t flat) {
    ElementBytes(array, flat, item, out, version);
    out += item;
  });
  return bytes;
}

// Every shard of `model` that lives on one of `devices`, in device memory,
// filled with BoxBytes, and the ShardSources that point at them.
struct DeviceShards {
  ShardSources sources;
  std::vector<MemoryBlock> memory;
  // Per array: (device, shard box, memory) of every filled shard.
  struct Placed {
    DeviceId device;
    Box box;
    void* data;
  };
  std::vector<std::vector<Placed>> placed;
};

inline DeviceShards FillShards(const std::vector<ArraySpec>& model,
                               absl::Span<Device* const> devices,
                               uint64_t version = 0) {
  DeviceShards out;
  out.placed.resize(model.size());
  for (Device* device : devices) {
    for (int a = 0; a < static_cast<int>(model.size()); ++a) {
      const ShardLayout layout = *model[a].sharding.Layout(model[a].shape);
      for (const DeviceShard& shard : layout.shards) {
        if (shard.device != device->id() || shard.box.empty()) continue;
        const std::vector<uint8_t> bytes =
            BoxBytes(model[a], a, shard.box, version);
        MemoryBlock block = *device->Allocate(bytes.size());
        std::memcpy(block.data(), bytes.data(), bytes.size());
        out.sources.Add(a, device->id(), block.data());
        out.placed[a].push_back({device->id(), shard.box, block.data()});
        out.memory.push_back(std::move(block));
      }
    }
  }
  return out;
}

// Rewrites every shard of `shards` with the contents of `version` (a
// training step changing the arrays).
// Refills array `a`'s shards with `version`'s bytes.
inline void RefillArray(const std::vector<ArraySpec>& model,
                        DeviceShards& shards, int a, uint64_t version) {
  for (const DeviceShards::Placed& p : shards.placed[a]) {
    const std::vector<uint8_t> bytes = BoxBytes(model[a], a, p.box, version);
    std::memcpy(p.data, bytes.data(), bytes.size());
  }
}

inline void Refill(const std::vector<ArraySpec>& model, DeviceShards& shards,
                   uint64_t version) {
  for (size_t a = 0; a < model.size(); ++a) {
    RefillArray(model, shards, static_cast<int>(a), version);
  }
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_ARRAY_BYTES_H_
