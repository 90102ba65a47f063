// Built against an installed hoist (find_package(hoist)): saves a sharded
// array, lists the root without devices, restores it elsewhere, checks it.
//
//   consumer ROOT
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/host_backend.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer ROOT\n");
    return 2;
  }
  const std::string root = argv[1];
  std::filesystem::remove_all(root);
  auto backend = *hoist::MakeHostBackend({.num_devices = 2});
  auto coordinator = hoist::MakeSingleProcessCoordinator();
  hoist::CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;
  const hoist::Mesh mesh = *hoist::Mesh::Create({"x"}, {2});
  const hoist::ArraySpec spec{
      "w", hoist::DType::kInt32, {64}, hoist::NamedSharding{mesh, {{"x"}}}};
  std::vector<int32_t> shards[2];
  for (int d = 0; d < 2; ++d) {
    for (int i = 0; i < 32; ++i) shards[d].push_back(d * 32 + i);
  }
  {
    auto manager =
        *hoist::CheckpointManager::Open(root, *backend, *coordinator, options);
    hoist::SaveArray array{spec,
                           {{0, shards[0].data()}, {1, shards[1].data()}}};
    if (!manager->Save(7, {array}).ok() || !manager->WaitUntilFinished().ok()) {
      std::fprintf(stderr, "consumer: save failed\n");
      return 1;
    }
  }
  auto reader = *hoist::CheckpointRoot::OpenForReading(root);
  const absl::StatusOr<hoist::Manifest> manifest = reader->ReadManifest(7);
  if (!manifest.ok() || manifest->arrays.size() != 1) return 1;
  const hoist::HostArrays host = hoist::WholeArraysInHost({spec});
  auto manager =
      *hoist::CheckpointManager::Open(root, *backend, *coordinator, options);
  if (!manager->Restore(7, host.targets).ok()) return 1;
  for (int i = 0; i < 64; ++i) {
    int32_t value;
    std::memcpy(&value, host.bytes[0].data() + 4 * i, 4);
    if (value != i) {
      std::fprintf(stderr, "consumer: element %d is %d\n", i, value);
      return 1;
    }
  }
  std::printf("consumer: saved, listed (%zu step), restored and checked\n",
              reader->List()->size());
  return 0;
}
