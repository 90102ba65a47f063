// bench/transfer: reproduces the two published staging experiments on the
// host backend, and sets staging throughput against this machine's memcpy.
//
//   (a) Orbax's dispatch experiment: ~600 arrays / ~5,000 replica slices on
//       16 processes x 8 logical devices (all 16 run at once, as 16 hosts
//       would): copy dispatches and staging time, one dispatch per slice
//       (Orbax today) vs one batched dispatch per device (hoist).
//   (b) PyTorch/XLA's experiment: a GPT-style model (weights + Adam) of about
//       1 GiB on 8 devices: staging one slice at a time, each awaited
//       (sequential) vs every device dispatched at once (parallel).
//   (c) Staging GB/s in (b) against one thread memcpy'ing the same slices
//       into the same (pre-faulted) pool memory, and against one thread
//       copying them with non-temporal stores (StreamCopy), as hoist does.
//
// Every figure is the median of --repeats runs after one warm-up run. The
// sink releases each lease at once: this measures staging (the time training
// is blocked), not storage.
//
//   build/release/bench/transfer_bench [--json] [--model-bytes 1GiB]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/stream_copy.h"
#include "hoist/host_backend.h"
#include "hoist/model/sample_model.h"
#include "hoist/save_plan.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {
namespace {

using bench::Check;
using bench::Die;

class DroppingSink final : public StagedExtentSink {
 public:
  void OnStaged(StagedExtent extent) override { extent.lease.Release(); }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One simulated host: its devices, pool, and the shard buffers of its share.
// Replicas of a box alias one buffer (copies only read it).
struct Host {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<StagingPool> pool;
  ShardSources sources;
  std::vector<MemoryBlock> memory;
};

void FillSources(const std::vector<ArraySpec>& model, const SavePlan& plan,
                 int process, Host& host) {
  absl::flat_hash_map<std::pair<int, Box>, const void*> by_box;
  for (int s : plan.SlicesOfProcess(process)) {
    const PlannedSlice& slice = plan.slices[s];
    const void*& base = by_box[{slice.array, slice.shard_box}];
    if (base == nullptr) {
      const int64_t bytes =
          slice.shard_box.num_elements() * ItemSize(model[slice.array].dtype);
      MemoryBlock block = Check(host.backend->devices()[0]->Allocate(bytes));
      std::memset(block.data(), 0x5a ^ slice.array, bytes);
      base = block.data();
      host.memory.push_back(std::move(block));
    }
    host.sources.Add(slice.array, slice.device, base);
  }
}

int64_t ShareBytes(const SavePlan& plan, int process) {
  int64_t bytes = 0;
  for (int s : plan.SlicesOfProcess(process)) {
    bytes += AlignUp(plan.slices[s].length_bytes, StagingPool::kAlignment);
  }
  return bytes;
}

struct Run {
  double seconds = 0;
  int64_t dispatches = 0;
  int64_t slices = 0;
  int64_t bytes = 0;
  int64_t waves = 0;
};

// Stages every process's share at once, one thread per process; the time is
// from a common start to the last process done.
Run StageAll(const SavePlan& plan, std::vector<Host>& hosts,
             TransferOptions options) {
  const int n = static_cast<int>(hosts.size());
  std::vector<TransferStats> stats(n);
  std::barrier start(n + 1);
  std::vector<std::thread> threads;
  for (int p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      TransferEngine engine(*hosts[p].pool, options);
      DroppingSink sink;
      start.arrive_and_wait();
      stats[p] = Check(engine.Stage(plan, p, hosts[p].backend->devices(),
                                    hosts[p].sources, sink));
    });
  }
  start.arrive_and_wait();
  const absl::Time t0 = absl::Now();
  for (std::thread& t : threads) t.join();
  Run run;
  run.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  for (const TransferStats& s : stats) {
    run.dispatches += s.dispatches;
    run.slices += s.slices;
    run.bytes += s.bytes;
    run.waves = std::max(run.waves, s.waves);
  }
  return run;
}

Run Measure(const SavePlan& plan, std::vector<Host>& hosts,
            TransferOptions options, int repeats) {
  StageAll(plan, hosts, options);  // warm-up
  std::vector<double> seconds;
  Run run;
  for (int i = 0; i < repeats; ++i) {
    run = StageAll(plan, hosts, options);
    seconds.push_back(run.seconds);
  }
  run.seconds = Median(seconds);
  return run;
}

std::vector<Host> MakeHosts(const std::vector<ArraySpec>& model,
                            const SavePlan& plan, int processes,
                            int devices_per_process, int64_t pool_bytes) {
  std::vector<Host> hosts(processes);
  for (int p = 0; p < processes; ++p) {
    hosts[p].backend = Check(
        MakeHostBackend({.num_devices = devices_per_process,
                         .first_device_id = int64_t{p} * devices_per_process}));
    const int64_t capacity = pool_bytes > 0
                                 ? pool_bytes
                                 : std::max<int64_t>(ShareBytes(plan, p), 4096);
    hosts[p].pool = Check(StagingPool::Create(*hosts[p].backend, capacity));
    FillSources(model, plan, p, hosts[p]);
  }
  return hosts;
}

// One thread copying every slice of process 0 (strided slices row by row)
// into the pool's memory: with memcpy, or (`stream`) as the host backend
// stages a slice, with non-temporal stores fenced once per slice
// (StreamCopies).
double CopySeconds(const SavePlan& plan, Host& host, int repeats, bool stream) {
  Lease target = Check(host.pool->Acquire(host.pool->capacity_bytes()));
  std::vector<double> seconds;
  for (int i = 0; i <= repeats; ++i) {
    const absl::Time t0 = absl::Now();
    int64_t at = 0;
    for (int s : plan.SlicesOfProcess(0)) {
      const PlannedSlice& slice = plan.slices[s];
      const auto* src = static_cast<const uint8_t*>(
          host.sources.Find(slice.array, slice.device));
      StreamCopies rows;
      for (int64_t r = 0; r < slice.copy.rows; ++r) {
        uint8_t* dst = target.data() + at + r * slice.copy.width_bytes;
        const uint8_t* from =
            src + slice.copy.src_offset_bytes + r * slice.copy.src_pitch_bytes;
        if (stream) {
          rows.Copy(dst, from, slice.copy.width_bytes);
        } else {
          std::memcpy(dst, from, slice.copy.width_bytes);
        }
      }
      at += AlignUp(slice.length_bytes, StagingPool::kAlignment);
    }
    if (i > 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  return Median(seconds);
}

int Main(int argc, char** argv) {
  CLI::App app(
      "hoist staging benchmark (host backend): batched vs per-slice "
      "dispatch, parallel vs sequential wait, vs memcpy");
  bool json = false;
  std::string model_bytes_text = "1GiB";
  int repeats = 5;
  int arrays = 600;
  app.add_flag("--json", json, "Print the figures as one JSON object");
  app.add_option("--model-bytes", model_bytes_text,
                 "Size of the GPT-style model of experiment (b)")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed runs per figure (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--arrays", arrays, "Arrays in experiment (a)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  const int64_t model_bytes = Check(ParseBytes(model_bytes_text));

  // (a) ~600 arrays of 64 KiB replicated on all 128 devices of 16 x 8;
  // min slice 8 KiB -> 8 slices each.
  const Mesh mesh_a = Check(Mesh::Create({"data", "model"}, {16, 8}));
  std::vector<ArraySpec> model_a;
  for (int i = 0; i < arrays; ++i) {
    model_a.push_back({absl::StrCat("layer", i / 6, "/w", i % 6),
                       DType::kFloat32,
                       {64, 256},
                       Sharding::Replicated(mesh_a)});
  }
  SavePlanOptions options_a;
  options_a.min_slice_bytes = 8 * kKiB;
  const Topology topology_a = Topology::Uniform(16, 8);
  const SavePlan plan_a = Check(MakeSavePlan(model_a, topology_a, options_a));
  std::vector<Host> hosts_a = MakeHosts(model_a, plan_a, 16, 8, 0);
  const Run per_slice = Measure(
      plan_a, hosts_a, {DispatchMode::kPerSlice, WaitMode::kParallel}, repeats);
  const Run batched = Measure(plan_a, hosts_a, {}, repeats);
  hosts_a.clear();

  // (b) + (c): GPT-style, 1 process x 8 devices on a 2 x 4 mesh.
  const GptConfig config = GptConfigForBytes(model_bytes);
  const Mesh mesh_b = Check(Mesh::Create({"data", "model"}, {2, 4}));
  const std::vector<ArraySpec> model_b = Check(GptModel(config, mesh_b));
  const Topology topology_b = Topology::Uniform(1, 8);
  const SavePlan plan_b = Check(MakeSavePlan(model_b, topology_b));
  std::vector<Host> hosts_b = MakeHosts(model_b, plan_b, 1, 8, 0);
  const Run sequential =
      Measure(plan_b, hosts_b, {DispatchMode::kPerSlice, WaitMode::kSequential},
              repeats);
  const Run parallel = Measure(plan_b, hosts_b, {}, repeats);
  const double memcpy_s =
      CopySeconds(plan_b, hosts_b[0], repeats, /*stream=*/false);
  const double stream_s =
      CopySeconds(plan_b, hosts_b[0], repeats, /*stream=*/true);
  // Bounded memory: the same save through a pool a quarter of its size.
  hosts_b[0].pool.reset();
  hosts_b[0].pool = Check(StagingPool::Create(
      *hosts_b[0].backend, AlignUp(ShareBytes(plan_b, 0) / 4, 4096)));
  const Run waves = Measure(plan_b, hosts_b, {}, repeats);

  const double gb = static_cast<double>(parallel.bytes) / 1e9;
  nlohmann::json out = {
      {"slices_a", per_slice.slices},
      {"arrays_a", arrays},
      {"devices_a", 128},
      {"dispatches_per_slice", per_slice.dispatches},
      {"dispatches_batched", batched.dispatches},
      {"staging_s_per_slice", per_slice.seconds},
      {"staging_s_batched", batched.seconds},
      {"bytes_b", parallel.bytes},
      {"slices_b", parallel.slices},
      {"staging_s_sequential", sequential.seconds},
      {"staging_s_parallel", parallel.seconds},
      {"dispatches_sequential", sequential.dispatches},
      {"dispatches_parallel", parallel.dispatches},
      {"staging_gbps", gb / parallel.seconds},
      {"memcpy_gbps", gb / memcpy_s},
      {"stream_copy_gbps", gb / stream_s},
      {"staging_s_quarter_pool", waves.seconds},
      {"waves_quarter_pool", waves.waves},
      {"dispatches_quarter_pool", waves.dispatches},
      {"repeats", repeats},
      {"cores", std::thread::hardware_concurrency()},
  };
  if (json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "hoist transfer benchmark, host backend, %d cores, median of %d runs\n\n",
      std::thread::hardware_concurrency(), repeats);
  std::cout << absl::StrFormat(
      "(a) %d arrays, %d slices, 16 processes x 8 devices\n"
      "    %-28s %10s %12s\n"
      "    %-28s %10d %10.1f ms\n"
      "    %-28s %10d %10.1f ms\n"
      "    batched / per-slice: dispatches %.2f%% (%.1f%% fewer), staging "
      "time %.2fx\n\n",
      arrays, per_slice.slices, "", "dispatches", "staging",
      "per-slice (Orbax today)", per_slice.dispatches, per_slice.seconds * 1e3,
      "batched (hoist)", batched.dispatches, batched.seconds * 1e3,
      100.0 * batched.dispatches / per_slice.dispatches,
      100.0 - 100.0 * batched.dispatches / per_slice.dispatches,
      batched.seconds / per_slice.seconds);
  std::cout << absl::StrFormat(
      "(b) GPT-style %d layers x d_model %d + Adam: %d arrays, %s in %d "
      "slices, 1 process x 8 devices\n"
      "    %-28s %10s %12s %10s\n"
      "    %-28s %10d %10.1f ms %7.2f GB/s\n"
      "    %-28s %10d %10.1f ms %7.2f GB/s\n"
      "    parallel / sequential staging time: %.2fx\n\n",
      config.layers, config.d_model, model_b.size(),
      FormatBytes(static_cast<double>(parallel.bytes)), parallel.slices, "",
      "dispatches", "staging", "rate", "sequential (one at a time)",
      sequential.dispatches, sequential.seconds * 1e3, gb / sequential.seconds,
      "parallel batched (hoist)", parallel.dispatches, parallel.seconds * 1e3,
      gb / parallel.seconds, parallel.seconds / sequential.seconds);
  std::cout << absl::StrFormat(
      "(c) single-thread memcpy of the same slices: %.1f ms, %.2f GB/s\n"
      "    the same with non-temporal stores (StreamCopy, as hoist's copies): "
      "%.1f ms, %.2f GB/s\n"
      "    hoist staging / memcpy throughput: %.2fx\n\n",
      memcpy_s * 1e3, gb / memcpy_s, stream_s * 1e3, gb / stream_s,
      memcpy_s / parallel.seconds);
  std::cout << absl::StrFormat(
      "bounded memory: the (b) save through a pool of a quarter of its size: "
      "%d waves, %d dispatches, %.1f ms (%.2fx the one-wave time)\n",
      waves.waves, waves.dispatches, waves.seconds * 1e3,
      waves.seconds / parallel.seconds);
  return 0;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
