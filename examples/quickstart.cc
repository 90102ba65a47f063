// The README's C++ quick start, compiled and run by the test suite so it
// stays true: two arrays sharded over 8 (host) devices are saved while
// "training" goes on, then restored onto a different mesh and checked.
//
//   build/release/examples/quickstart [ROOT]
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"

int main(int argc, char** argv) {
  const std::string root =
      argc > 1 ? argv[1]
               : (std::filesystem::temp_directory_path() / "hoist-quickstart")
                     .string();
  std::filesystem::remove_all(root);

  // Devices: 8 logical devices over host RAM (MakeCudaBackend() for GPUs).
  auto backend = *hoist::MakeHostBackend({.num_devices = 8});
  auto coordinator = *hoist::MakeJobCoordinator();  // MPI under mpirun
  hoist::CheckpointManagerOptions options;
  options.pool_bytes = 64 << 20;  // pinned, allocated once
  options.keep_last = 3;
  auto manager =
      *hoist::CheckpointManager::Open(root, *backend, *coordinator, options);

  // Arrays: a weight sharded over "model" and replicated over "data".
  const hoist::Mesh mesh = *hoist::Mesh::Create({"data", "model"}, {2, 4});
  const hoist::ArraySpec spec{"params/w",
                              hoist::DType::kFloat32,
                              {1024, 256},
                              hoist::NamedSharding{mesh, {{}, {"model"}}}};
  const hoist::ShardLayout layout = *spec.sharding.Layout(spec.shape);
  std::vector<hoist::MemoryBlock> shards;
  hoist::SaveArray array{spec, {}};
  for (const hoist::DeviceShard& shard : layout.shards) {
    const int64_t bytes = shard.box.num_elements() * 4;
    hoist::Device* device = backend->devices()[shard.device];
    shards.push_back(*device->Allocate(bytes));
    // The host backend's memory is host memory; a GPU's would be filled by
    // kernels. Element (i, j) holds i * 256 + j.
    auto* data = static_cast<float*>(shards.back().data());
    for (int64_t i = 0; i < shard.box.shape()[0]; ++i) {
      for (int64_t j = 0; j < shard.box.shape()[1]; ++j) {
        data[i * shard.box.shape()[1] + j] = static_cast<float>(
            (shard.box.origin()[0] + i) * 256 + shard.box.origin()[1] + j);
      }
    }
    array.shards.push_back({shard.device, shards.back().data()});
  }

  // Save: returns once the shards are copied off the devices.
  absl::StatusOr<hoist::SaveHandle> handle =
      manager->Save(/*step=*/100, {array}, R"({"lr": 0.001})");
  if (!handle.ok()) {
    std::fprintf(stderr, "save: %s\n", handle.status().ToString().c_str());
    return 1;
  }
  // ... training goes on; writing and committing happen in the background.

  // Arrays that stay where they are (updated in place, as PyTorch's are)
  // can be registered once: each later save reads none of them.
  absl::StatusOr<hoist::RegisteredArrays> state = manager->Register({array});
  if (!state.ok()) {
    std::fprintf(stderr, "register: %s\n", state.status().ToString().c_str());
    return 1;
  }
  handle = manager->Save(/*step=*/101, *state);
  if (!handle.ok()) {
    std::fprintf(stderr, "save: %s\n", handle.status().ToString().c_str());
    return 1;
  }
  if (absl::Status s = manager->WaitUntilFinished(); !s.ok()) {
    std::fprintf(stderr, "save: %s\n", s.ToString().c_str());
    return 1;
  }

  // Restore the latest step into host memory (or any sharding on devices).
  std::vector<float> whole(1024 * 256);
  hoist::RestoreTarget target{
      spec.name,
      spec.dtype,
      spec.shape,
      {{hoist::Box::FromShape(spec.shape), nullptr, whole.data()}}};
  absl::StatusOr<hoist::RestoreStats> restored =
      manager->Restore(std::nullopt, {target});
  if (!restored.ok()) {
    std::fprintf(stderr, "restore: %s\n", restored.status().ToString().c_str());
    return 1;
  }
  for (size_t k = 0; k < whole.size(); ++k) {
    if (whole[k] != static_cast<float>(k)) {
      std::fprintf(stderr, "restore: element %zu is %g\n", k, whole[k]);
      return 1;
    }
  }
  std::printf(
      "saved steps 100 and 101 to %s and restored step %lld: %zu elements "
      "verified\n",
      root.c_str(), static_cast<long long>(restored->step), whole.size());
  manager.reset();
  std::filesystem::remove_all(root);
  return 0;
}
