// Planning cost: a ~1,000-array GPT-style model (weights + Adam) on 16
// processes x 8 devices (mesh data=16 x model=8), per replica rule. Every
// process plans every save, so this is time added to each save's critical
// path unless the plan is cached.
//
//   build/release/bench/plan_bench
#include <benchmark/benchmark.h>

#include "hoist/model/sample_model.h"
#include "hoist/save_plan.h"

namespace hoist {
namespace {

void BM_PlanGpt1000Arrays16x8(benchmark::State& state) {
  GptConfig config;
  config.layers = 28;  // 3 * (2 + 28 * 12 + 2) + 1 = 1021 arrays
  config.d_model = 1024;
  const Mesh mesh = *Mesh::Create({"data", "model"}, {16, 8});
  const std::vector<ArraySpec> model = *GptModel(config, mesh);
  const Topology topology = Topology::Uniform(16, 8);
  SavePlanOptions options;
  options.replica_rule = static_cast<ReplicaRule>(state.range(0));
  options.writer_streams = 2;
  int64_t slices = 0;
  for (auto _ : state) {
    absl::StatusOr<SavePlan> plan = MakeSavePlan(model, topology, options);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    slices = static_cast<int64_t>(plan->slices.size());
    benchmark::DoNotOptimize(plan);
  }
  state.SetLabel(std::string(ReplicaRuleName(options.replica_rule)));
  state.counters["arrays"] = static_cast<double>(model.size());
  state.counters["slices"] = static_cast<double>(slices);
}
BENCHMARK(BM_PlanGpt1000Arrays16x8)
    ->Arg(static_cast<int>(ReplicaRule::kSingleReplica))
    ->Arg(static_cast<int>(ReplicaRule::kOrbax))
    ->Arg(static_cast<int>(ReplicaRule::kBalanced))
    ->Unit(benchmark::kMillisecond);

// How the balanced rule's plan time grows: with the arrays (layers x 36,
// weights + Adam) at 128 devices, and with the devices (DATA x 8, one
// process per DATA row) at ~10,000 arrays, up to the case of
// 100,813 arrays on 1,024 devices. Near-linear growth in the arrays shows
// as a steady "per_array" (seconds per array).
// A GPT-style model of `layers` layers (d_model 1024) on DATA x 8 devices,
// one process per DATA row, planned by the balanced rule.
struct BalancedCase {
  std::vector<ArraySpec> model;
  Topology topology;
  SavePlanOptions options;
};
BalancedCase MakeBalancedCase(int layers, int64_t data) {
  GptConfig config;
  config.layers = layers;
  config.d_model = 1024;
  const Mesh mesh = *Mesh::Create({"data", "model"}, {data, 8});
  BalancedCase out{*GptModel(config, mesh),
                   Topology::Uniform(static_cast<int>(data), 8),
                   {}};
  out.options.replica_rule = ReplicaRule::kBalanced;
  return out;
}

void BM_PlanGrowthBalanced(benchmark::State& state) {
  const int64_t data = state.range(1);
  const auto [model, topology, options] =
      MakeBalancedCase(static_cast<int>(state.range(0)), data);
  for (auto _ : state) {
    absl::StatusOr<SavePlan> plan = MakeSavePlan(model, topology, options);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(plan);
  }
  const double arrays = static_cast<double>(model.size());
  state.counters["arrays"] = arrays;
  state.counters["devices"] = static_cast<double>(data * 8);
  state.counters["per_array"] =
      benchmark::Counter(arrays, benchmark::Counter::kIsIterationInvariantRate |
                                     benchmark::Counter::kInvert);
}
BENCHMARK(BM_PlanGrowthBalanced)
    ->Args({28, 16})
    ->Args({280, 16})
    ->Args({2800, 16})
    ->Args({280, 32})
    ->Args({280, 64})
    ->Args({280, 128})
    ->Args({2800, 128})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Finding one process's share of a plan (SavePlan::SlicesOfProcess), a pass
// over every slice of the job: what TransferEngine::Begin did on the
// training thread at every save until the CheckpointManager kept the share
// with its cached plan. The plan's slices are first evicted from the caches
// (as a training step between saves does), by a 64 MiB pass.
void BM_ShareOfProcess(benchmark::State& state) {
  const BalancedCase c =
      MakeBalancedCase(static_cast<int>(state.range(0)), state.range(1));
  const SavePlan plan = *MakeSavePlan(c.model, c.topology, c.options);
  std::vector<uint8_t> evict(size_t{64} << 20, 1);
  int64_t share = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t i = 0; i < evict.size(); i += 64) ++evict[i];
    benchmark::ClobberMemory();
    state.ResumeTiming();
    const std::vector<int> slices = plan.SlicesOfProcess(0);
    share = static_cast<int64_t>(slices.size());
    benchmark::DoNotOptimize(slices);
  }
  state.counters["slices"] = static_cast<double>(plan.slices.size());
  state.counters["share"] = static_cast<double>(share);
}
BENCHMARK(BM_ShareOfProcess)
    ->Args({28, 16})
    ->Args({2800, 128})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hoist

BENCHMARK_MAIN();
