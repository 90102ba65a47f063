// Test helper for crash_test (built by src/hoist/checkpoint/CMakeLists.txt,
// kept out of the library): opens ROOT (recovering what the last kill
// left), prints "opened", then saves forever (until killed), one step after
// another from START, printing "committed N ..." once step N has committed.
// Step N's arrays are testing/crash_model.h's. Under mpirun with several ranks
// it is one process of a job (MPI coordinator, 8 / ranks devices each) and rank
// 0 prints (demo_mpi_test kills one rank). With POOL_BYTES smaller than the
// model (about 600 KiB), the waves the pool cannot take are staged into its
// overflow; each line then ends with the bytes staged there.
//
//   crash_saver ROOT START [POOL_BYTES]   (default 4 MiB)
//   prints: committed N overflow BYTES
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "testing/crash_model.h"

namespace hoist {
namespace {

int Main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: crash_saver ROOT START [POOL_BYTES]\n");
    return 2;
  }
  const std::string root = argv[1];
  const int64_t start = std::atoll(argv[2]);
  const int64_t pool_bytes = argc == 4 ? std::atoll(argv[3]) : 4 << 20;
  absl::StatusOr<std::unique_ptr<Coordinator>> job = MakeJobCoordinator();
  if (!job.ok()) {
    std::fprintf(stderr, "crash_saver: %s\n",
                 std::string(job.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Coordinator> coordinator = *std::move(job);
  const int devices = 8 / coordinator->size();
  std::unique_ptr<Backend> backend =
      *MakeHostBackend({.num_devices = devices,
                        .first_device_id = coordinator->rank() * devices});
  CheckpointManagerOptions options;
  options.pool_bytes = pool_bytes;
  options.keep_last = 3;
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root, *backend, *coordinator, options);
  if (!manager.ok()) {
    std::fprintf(stderr, "crash_saver: %s\n",
                 std::string(manager.status().message()).c_str());
    return 1;
  }
  if (coordinator->rank() == 0) {
    std::printf("opened\n");
    std::fflush(stdout);
  }
  const std::vector<ArraySpec> model = testing::CrashModel();
  // Each device's shards, refilled for every step.
  struct Shard {
    int array;
    Box box;
    MemoryBlock memory;
  };
  std::vector<Shard> shards;
  std::vector<SaveArray> arrays;
  for (size_t a = 0; a < model.size(); ++a) {
    const ShardLayout layout = *model[a].sharding.Layout(model[a].shape);
    SaveArray array{model[a], {}};
    for (const DeviceShard& shard : layout.shards) {
      const DeviceId first = backend->devices()[0]->id();
      if (shard.device < first || shard.device >= first + devices) continue;
      const int64_t bytes = shard.box.num_elements() * ItemSize(model[a].dtype);
      MemoryBlock memory =
          *backend->devices()[shard.device - first]->Allocate(bytes);
      array.shards.push_back({shard.device, memory.data()});
      shards.push_back({static_cast<int>(a), shard.box, std::move(memory)});
    }
    arrays.push_back(std::move(array));
  }
  for (int64_t step = start;; ++step) {
    // Whole arrays are FillSynthetic(step * 1000 + a); each shard is its box.
    for (Shard& shard : shards) {
      const ArraySpec& spec = model[shard.array];
      const int64_t item = ItemSize(spec.dtype);
      std::vector<uint8_t> whole(Box::FromShape(spec.shape).num_elements() *
                                 item);
      FillSynthetic(whole.data(), static_cast<int64_t>(whole.size()),
                    testing::CrashSeed(step, shard.array));
      const std::vector<int64_t> strides = CStrides(spec.shape);
      // Copy the shard's box out of the whole array, row by row.
      std::vector<int64_t> index = shard.box.origin();
      auto* out = static_cast<uint8_t*>(shard.memory.data());
      const int64_t inner =
          shard.box.rank() == 0 ? 1 : shard.box.shape().back();
      const int64_t rows =
          shard.box.rank() == 0 ? 1 : shard.box.num_elements() / inner;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t flat = 0;
        for (int d = 0; d < shard.box.rank(); ++d)
          flat += index[d] * strides[d];
        std::memcpy(out + r * inner * item, whole.data() + flat * item,
                    inner * item);
        for (int d = shard.box.rank() - 2; d >= 0; --d) {
          if (++index[d] < shard.box.limit(d)) break;
          index[d] = shard.box.origin()[d];
        }
      }
    }
    absl::StatusOr<SaveHandle> handle = (*manager)->Save(step, arrays);
    absl::StatusOr<SaveInfo> info =
        handle.ok() ? handle->WaitCommitted() : handle.status();
    if (!info.ok()) {
      std::fprintf(stderr, "crash_saver: step %lld failed\n",
                   static_cast<long long>(step));
      return 1;
    }
    if (coordinator->rank() == 0) {
      std::printf("committed %lld overflow %lld\n",
                  static_cast<long long>(step),
                  static_cast<long long>(info->overflow_bytes));
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
