// Test helpers: a small model with every dtype and every kind of sharding
// (rows, columns, both mesh axes on one dimension, 3-D, replicated, a
// scalar), the same model on another mesh, and the SaveArrays that point at
// a DeviceShards. Sharded sizes divide by 8, so any data x model mesh of up
// to 8 devices fits.
#ifndef HOIST_TESTING_MIXED_MODEL_H_
#define HOIST_TESTING_MIXED_MODEL_H_

#include <string>
#include <vector>

#include "hoist/array_spec.h"
#include "hoist/checkpoint_manager.h"
#include "testing/array_bytes.h"

namespace hoist::testing {

inline Mesh MeshOf(int64_t data, int64_t model) {
  return *Mesh::Create({"data", "model"}, {data, model});
}

// 16 arrays of 512 x 64 float32 sharded over both axes of a 2 x 4 mesh:
// on 8 devices, 16 KiB a shard, 2 MiB in all (larger than a small pool:
// staging in waves).
inline std::vector<ArraySpec> SixteenShardedArrays() {
  std::vector<ArraySpec> model;
  for (int i = 0; i < 16; ++i) {
    model.push_back({"w" + std::to_string(i),
                     DType::kFloat32,
                     {512, 64},
                     NamedSharding{MeshOf(2, 4), {{"data", "model"}}}});
  }
  return model;
}

inline std::vector<ArraySpec> MixedModel(const Mesh& mesh) {
  std::vector<ArraySpec> model;
  int i = 0;
  for (DType dtype : kAllDTypes) {
    const std::string name = "params/" + std::string(DTypeName(dtype));
    switch (i++ % 4) {
      case 0:
        model.push_back(
            {name, dtype, {16, 24}, NamedSharding{mesh, {{}, {"model"}}}});
        break;
      case 1:
        model.push_back(
            {name, dtype, {40, 3}, NamedSharding{mesh, {{"data", "model"}}}});
        break;
      case 2:
        model.push_back({name, dtype, {33, 17}, Sharding::Replicated(mesh)});
        break;
      default:
        model.push_back({name,
                         dtype,
                         {8, 5, 8},
                         NamedSharding{mesh, {{"model"}, {}, {"data"}}}});
    }
  }
  model.push_back({"opt/count", DType::kInt32, {}, Sharding::Replicated(mesh)});
  return model;
}

// The same arrays and partition specs on `mesh`.
inline std::vector<ArraySpec> Reshard(std::vector<ArraySpec> model,
                                      const Mesh& mesh) {
  for (ArraySpec& spec : model) {
    spec.sharding = NamedSharding{mesh, spec.sharding.named()->spec};
  }
  return model;
}

// What CheckpointManager::Save takes for `model`'s shards in `shards`.
inline std::vector<SaveArray> SaveArraysOf(const std::vector<ArraySpec>& model,
                                           const DeviceShards& shards) {
  std::vector<SaveArray> arrays;
  for (size_t a = 0; a < model.size(); ++a) {
    SaveArray array{model[a], {}};
    for (const DeviceShards::Placed& placed : shards.placed[a]) {
      array.shards.push_back({placed.device, placed.data});
    }
    arrays.push_back(std::move(array));
  }
  return arrays;
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_MIXED_MODEL_H_
