// bench/gpu: the CUDA backend on a real GPU (run by bench/gpu.sh on a
// machine that has one). Prints a table, and JSON with --json:
//   limit       one cudaMemcpyAsync of one large device buffer into pinned
//               memory (the PCIe / C2C limit, ~53 GB/s on H100/H200)
//   staging     hoist staging a GPT-style model's shards on each device into
//               the pinned pool (batched, one dispatch per device)
//   dispatch    ~5,000 small slices on one device: per-slice vs batched
//               dispatches and wall time
//   round trip  a CheckpointManager save and restore of random data through
//               the GPU, compared byte for byte
//   fence       what a save in dispatched mode blocks the CPU for: waiting
//               for the copies (WaitStaged) against ordering the training
//               stream after them (WaitStagedOn); the stream then
//               overwrites the arrays, and the saved step must not see it
//
//   build/release/bench/gpu_bench [--bytes 4GiB] [--root DIR] [--json]
//                                 [--json-file FILE]
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "hoist/base/bytes.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/cuda_backend.h"
#include "hoist/model/sample_model.h"
#include "hoist/model/synthetic.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {
namespace {

using bench::Check;
using bench::Die;
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    Die(absl::InternalError(
        absl::StrFormat("%s: %s", what, cudaGetErrorString(error))));
  }
}

class DroppingSink final : public StagedExtentSink {
 public:
  void OnStaged(StagedExtent extent) override { extent.lease.Release(); }
};

// One large device buffer into pinned memory with a plain cudaMemcpyAsync.
double LimitGbps(int64_t bytes) {
  void* device = nullptr;
  void* host = nullptr;
  CheckCuda(cudaMalloc(&device, bytes), "cudaMalloc");
  CheckCuda(cudaHostAlloc(&host, bytes, cudaHostAllocPortable),
            "cudaHostAlloc");
  cudaStream_t stream;
  CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            "cudaStreamCreate");
  double best = 0;
  for (int i = 0; i < 4; ++i) {
    const absl::Time t0 = absl::Now();
    CheckCuda(
        cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
    CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (i > 0) {
      best =
          std::max(best, bytes / 1e9 / absl::ToDoubleSeconds(absl::Now() - t0));
    }
  }
  cudaStreamDestroy(stream);
  cudaFreeHost(host);
  cudaFree(device);
  return best;
}

struct Arrays {
  std::vector<ArraySpec> specs;
  std::vector<MemoryBlock> memory;
  ShardSources sources;
  std::vector<SaveArray> save;
};

// `count` arrays of `bytes` each, all on device 0 (explicit sharding), filled
// with random bytes through CopyFromHost.
Arrays OnDevice(Backend& backend, int count, int64_t bytes, uint64_t seed) {
  Arrays out;
  Device& device = *backend.devices()[0];
  std::vector<uint8_t> host(bytes);
  for (int i = 0; i < count; ++i) {
    ExplicitSharding sharding;
    sharding.shards = {{device.id(), Box({0}, {bytes})}};
    out.specs.push_back(
        {absl::StrFormat("a%05d", i), DType::kUint8, {bytes}, sharding});
    MemoryBlock block = Check(device.Allocate(bytes));
    FillSynthetic(host.data(), bytes, seed + i);
    const CopyOp op{host.data(), bytes, block.data(), bytes, bytes, 1};
    if (absl::Status s = device.CopyFromHost({&op, 1}).Wait(); !s.ok()) Die(s);
    out.sources.Add(i, device.id(), block.data());
    out.save.push_back({out.specs.back(), {{device.id(), block.data()}}});
    out.memory.push_back(std::move(block));
  }
  return out;
}

double StageSeconds(const SavePlan& plan, Backend& backend, StagingPool& pool,
                    const ShardSources& sources, TransferOptions options,
                    int64_t* dispatches) {
  TransferEngine engine(pool, options);
  DroppingSink sink;
  engine.Stage(plan, 0, backend.devices(), sources, sink).IgnoreError();
  std::vector<double> seconds;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<TransferStats> stats =
        engine.Stage(plan, 0, backend.devices(), sources, sink);
    if (!stats.ok()) Die(stats.status());
    seconds.push_back(absl::ToDoubleSeconds(stats->time_to_staged));
    *dispatches = stats->dispatches;
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[1];
}

int Main(int argc, char** argv) {
  CLI::App app("hoist CUDA backend benchmark (needs a GPU)");
  std::string bytes_text = "4GiB", root, json_file;
  bool json = false;
  app.add_option("--bytes", bytes_text, "Bytes per device to stage")
      ->capture_default_str();
  app.add_option("--root", root,
                 "Checkpoint root for the round trip "
                 "(default: a new directory here, removed)");
  app.add_flag("--json", json, "Print JSON instead of the table");
  app.add_option("--json-file", json_file,
                 "Also write the JSON to this file (same run as the table)");
  CLI11_PARSE(app, argc, argv);
  const int64_t bytes = Check(ParseBytes(bytes_text));
  std::unique_ptr<Backend> backend = Check(MakeCudaBackend());
  const int devices = static_cast<int>(backend->devices().size());

  // The limit.
  const double limit_gbps = LimitGbps(bytes);

  // Staging a model's worth of bytes per device (4 MiB slices).
  const int per_device = static_cast<int>(bytes / (4 << 20));
  Arrays big = OnDevice(*backend, std::max(1, per_device), 4 << 20, 1);
  const Topology one = Check(Topology::Create({{backend->devices()[0]->id()}}));
  const SavePlan big_plan = Check(MakeSavePlan(big.specs, one));
  std::unique_ptr<StagingPool> pool =
      Check(StagingPool::Create(*backend, bytes + (64 << 20)));
  int64_t big_dispatches = 0;
  const double staging_s =
      StageSeconds(big_plan, *backend, *pool, big.sources, {}, &big_dispatches);
  const double staged_bytes = static_cast<double>(big.specs.size()) * (4 << 20);
  big = {};

  // ~5,000 small slices: per-slice vs batched.
  Arrays small = OnDevice(*backend, 5000, 64 << 10, 2);
  const SavePlan small_plan = Check(MakeSavePlan(small.specs, one));
  int64_t per_slice_dispatches = 0, batched_dispatches = 0;
  const double per_slice_s = StageSeconds(
      small_plan, *backend, *pool, small.sources,
      {.dispatch = DispatchMode::kPerSlice}, &per_slice_dispatches);
  const double batched_s = StageSeconds(small_plan, *backend, *pool,
                                        small.sources, {}, &batched_dispatches);
  pool.reset();

  // Save / restore round trip through a CheckpointManager, then what the
  // training loop waits for before its next step may overwrite the arrays:
  // the CPU waiting for the copies (WaitStaged) against the training stream
  // ordered after them on the GPU (WaitStagedOn), whose overwrite must not
  // reach the saved step.
  const bool own_root = root.empty();
  if (own_root) root = absl::StrFormat("hoist-gpu-bench.%d", getpid());
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  CheckpointManagerOptions options;
  options.pool_bytes = 512 << 20;
  bool verified = true, fence_verified = true;
  double blocked_wait_staged_s = 0, blocked_fence_s = 0;
  {
    std::unique_ptr<CheckpointManager> manager =
        Check(CheckpointManager::Open(root, *backend, *coordinator, options));
    Device& device = *backend->devices()[0];
    // Restores `step` into new device memory, one block per array.
    auto restore = [&](int64_t step) {
      std::vector<MemoryBlock> restored;
      std::vector<RestoreTarget> targets;
      for (const ArraySpec& spec : small.specs) {
        restored.push_back(Check(device.Allocate(spec.shape[0])));
        targets.push_back(
            {spec.name,
             spec.dtype,
             spec.shape,
             {{Box::FromShape(spec.shape), &device, restored.back().data()}}});
      }
      Check(manager->Restore(step, targets));
      return restored;
    };
    // Whether each of `a` holds the bytes of the same array of `b`.
    auto same = [&](const std::vector<MemoryBlock>& a,
                    const std::vector<MemoryBlock>& b) {
      bool equal = true;
      std::vector<uint8_t> x(64 << 10), y(64 << 10);
      for (size_t i = 0; i < a.size(); ++i) {
        const CopyOp ops[] = {
            {a[i].data(), 64 << 10, x.data(), 64 << 10, 64 << 10, 1},
            {b[i].data(), 64 << 10, y.data(), 64 << 10, 64 << 10, 1}};
        if (absl::Status s = device.CopyToHost(ops).Wait(); !s.ok()) Die(s);
        equal &= x == y;
      }
      return equal;
    };
    SaveHandle handle = Check(manager->Save(1, small.save));
    if (absl::Status s = handle.WaitCommitted().status(); !s.ok()) Die(s);
    const std::vector<MemoryBlock> original = restore(1);
    verified = same(small.memory, original);

    absl::Time t0 = absl::Now();
    handle = Check(manager->Save(2, small.save, "{}", ReturnWhen::kDispatched));
    if (absl::Status s = handle.WaitStaged(); !s.ok()) Die(s);
    blocked_wait_staged_s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (absl::Status s = handle.WaitCommitted().status(); !s.ok()) Die(s);

    cudaStream_t training;
    CheckCuda(cudaStreamCreateWithFlags(&training, cudaStreamNonBlocking),
              "cudaStreamCreate");
    t0 = absl::Now();
    handle = Check(manager->Save(3, small.save, "{}", ReturnWhen::kDispatched));
    if (absl::Status s = handle.WaitStagedOn(training); !s.ok()) Die(s);
    blocked_fence_s = absl::ToDoubleSeconds(absl::Now() - t0);
    for (const MemoryBlock& block : small.memory) {  // the next step's writes
      CheckCuda(cudaMemsetAsync(block.data(), 0xff, 64 << 10, training),
                "cudaMemsetAsync");
    }
    CheckCuda(cudaStreamSynchronize(training), "cudaStreamSynchronize");
    cudaStreamDestroy(training);
    if (absl::Status s = handle.WaitCommitted().status(); !s.ok()) Die(s);
    fence_verified = same(restore(3), original);
  }
  if (own_root) std::filesystem::remove_all(root);

  nlohmann::json out = {
      {"backend", std::string(backend->name())},  // "cuda-sim": not a GPU
      {"devices", devices},
      {"limit_d2h_gbps", limit_gbps},
      {"staging_gbps", staged_bytes / 1e9 / staging_s},
      {"staging_dispatches", big_dispatches},
      {"slices", small_plan.slices.size()},
      {"dispatches_per_slice", per_slice_dispatches},
      {"dispatches_batched", batched_dispatches},
      {"staging_s_per_slice", per_slice_s},
      {"staging_s_batched", batched_s},
      {"round_trip_verified", verified},
      {"blocked_wait_staged_s", blocked_wait_staged_s},
      {"blocked_fence_s", blocked_fence_s},
      {"fence_verified", fence_verified},
  };
  if (!json_file.empty()) {
    std::ofstream file(json_file);
    file << out.dump(2) << "\n";
    if (!file.flush()) {
      Die(absl::UnavailableError(
          absl::StrFormat("cannot write %s", json_file)));
    }
  }
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "hoist gpu bench: %d %s device(s)\n"
        "D2H limit (one cudaMemcpyAsync, %s):  %.1f GB/s\n"
        "hoist staging (%d x 4 MiB slices, %d dispatch(es)): %.1f GB/s "
        "(%.0f%% of the limit)\n"
        "%d slices of 64 KiB: per-slice %d dispatches %.2f ms, batched %d "
        "dispatch(es) %.2f ms (%.2fx)\n"
        "save/restore round trip through the GPU: %s\n"
        "blocked per save of %d slices: CPU waits for the copies %.2f ms, "
        "training stream ordered after them %.2f ms (%.1fx less); the "
        "stream's overwrite %s\n",
        devices, backend->name(), FormatBytes(static_cast<double>(bytes)),
        limit_gbps, static_cast<int>(staged_bytes / (4 << 20)), big_dispatches,
        staged_bytes / 1e9 / staging_s,
        100 * staged_bytes / 1e9 / staging_s / limit_gbps,
        small_plan.slices.size(), per_slice_dispatches, per_slice_s * 1e3,
        batched_dispatches, batched_s * 1e3, batched_s / per_slice_s,
        verified ? "verified bit-exact" : "MISMATCH", small_plan.slices.size(),
        blocked_wait_staged_s * 1e3, blocked_fence_s * 1e3,
        blocked_wait_staged_s / blocked_fence_s,
        fence_verified ? "came after the copies (saved step bit-exact)"
                       : "REACHED THE SAVED STEP");
  }
  return verified && fence_verified ? 0 : 1;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
