// bench/when_busy: a training loop whose storage gets stuck mid-run (a hung
// NFS or Lustre target), saved with when_busy = wait and with skip.
//
// Each step "computes" for --step-time and saves every step (staged mode)
// a --size model on 8 host devices through a storage that forwards to the
// real filesystem (posix) and stalls on demand. At step --stall-at every
// write and sync stops for --stall; then storage comes back. Per policy:
// the loop's wall time as a ratio of the same loop without saves (run
// first, same process), the longest and median blocked time per save, the
// saves skipped, the longest durability lag seen (time since the last
// commit, polled each step), and whether every committed step verifies.
//
//   build/release/bench/when_busy_bench [--size 64MiB] [--steps 40]
//       [--step-time 50ms] [--stall-at 10] [--stall 1s] [--root DIR]
//       [--json]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "hoist/base/bytes.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/io/fault_storage.h"
#include "hoist/model/synthetic.h"

namespace hoist {
namespace {

using bench::Check;
using bench::Die;

struct Model {
  std::vector<std::vector<uint8_t>> memory;
  std::vector<SaveArray> arrays;
};

// 32 arrays, each whole on one of the 8 devices.
Model MakeModel(Backend& backend, int64_t bytes) {
  Model model;
  const int64_t each = std::max<int64_t>(4096, bytes / 32);
  for (int i = 0; i < 32; ++i) {
    const DeviceId device = backend.devices()[i % 8]->id();
    ExplicitSharding sharding;
    sharding.shards = {{device, Box({0}, {each})}};
    model.memory.emplace_back(each);
    FillSynthetic(model.memory.back().data(), each, i);
    model.arrays.push_back(
        {{absl::StrFormat("layer%02d", i), DType::kUint8, {each}, sharding},
         {{device, model.memory.back().data()}}});
  }
  return model;
}

struct LoopResult {
  double wall_s = 0;
  double max_blocked_s = 0;
  double median_blocked_s = 0;
  int64_t skipped = 0;
  double max_lag_s = 0;
  int64_t committed = 0;
  bool verified = true;
};

// The loop; `policy` empty: no saves at all (the baseline).
LoopResult RunLoop(Backend& backend, Model& model, const std::string& root,
                   std::optional<CheckpointManagerOptions::WhenBusy> policy,
                   int steps, absl::Duration step_time, int stall_at,
                   absl::Duration stall) {
  std::unique_ptr<Storage> posix = MakePosixStorage();
  FaultInjectingStorage storage(*posix, {});
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  std::unique_ptr<CheckpointManager> manager;
  if (policy) {
    CheckpointManagerOptions options;
    options.pool_bytes = int64_t{256} << 20;
    options.keep_last = 3;
    options.when_busy = *policy;
    manager = Check(CheckpointManager::Open(root, backend, *coordinator,
                                            options, &storage));
  }
  LoopResult result;
  std::vector<double> blocked;
  std::thread resumer;
  const absl::Time start = absl::Now();
  for (int step = 1; step <= steps; ++step) {
    for (std::vector<uint8_t>& m : model.memory) m[step % m.size()] ^= 1;
    if (step == stall_at) {
      storage.Stall();
      resumer = std::thread([&storage, stall] {
        absl::SleepFor(stall);
        storage.Resume();
      });
    }
    if (manager != nullptr) {
      const absl::Time before = absl::Now();
      SaveHandle handle = Check(manager->Save(step, model.arrays));
      blocked.push_back(absl::ToDoubleSeconds(absl::Now() - before));
      const Durability lag = manager->durability();
      if (lag.last_committed_step.has_value()) {
        result.max_lag_s =
            std::max(result.max_lag_s,
                     absl::ToDoubleSeconds(absl::Now() - lag.last_committed));
      }
    }
    absl::SleepFor(step_time);  // forward and backward on the devices
  }
  if (manager != nullptr) {
    if (absl::Status s = manager->WaitUntilFinished(); !s.ok()) Die(s);
  }
  result.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (resumer.joinable()) resumer.join();
  if (manager == nullptr) return result;
  result.skipped = manager->durability().skipped_saves;
  for (int64_t step : Check(manager->List())) {
    ++result.committed;
    result.verified &= Check(manager->Verify(step)).ok();
  }
  std::sort(blocked.begin(), blocked.end());
  result.max_blocked_s = blocked.back();
  result.median_blocked_s = blocked[blocked.size() / 2];
  return result;
}

int Main(int argc, char** argv) {
  CLI::App app(
      "A training loop whose storage gets stuck: when_busy wait vs skip");
  std::string size_text = "64MiB", step_text = "50ms", stall_text = "1s", root;
  int steps = 40, stall_at = 10;
  bool json = false;
  app.add_option("--size", size_text, "Model bytes")->capture_default_str();
  app.add_option("--steps", steps, "Training steps, a save each")
      ->capture_default_str()
      ->check(CLI::Range(2, 100000));
  app.add_option("--step-time", step_text, "Compute per step")
      ->capture_default_str();
  app.add_option("--stall-at", stall_at, "The step at which storage sticks")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--stall", stall_text, "How long storage stays stuck")
      ->capture_default_str();
  app.add_option("--root", root,
                 "Where the roots go (default: a new directory here)");
  app.add_flag("--json", json, "Print JSON");
  CLI11_PARSE(app, argc, argv);
  const int64_t bytes = Check(ParseBytes(size_text));
  absl::Duration step_time, stall;
  if (!absl::ParseDuration(step_text, &step_time) ||
      !absl::ParseDuration(stall_text, &stall)) {
    Die(absl::InvalidArgumentError("--step-time and --stall are durations"));
  }
  const bool own_root = root.empty();
  if (own_root) root = absl::StrFormat("hoist-when-busy-bench.%d", getpid());
  std::filesystem::create_directories(root);
  std::unique_ptr<Backend> backend = Check(MakeHostBackend({.num_devices = 8}));
  Model model = MakeModel(*backend, bytes);

  const LoopResult baseline = RunLoop(*backend, model, root + "/none",
                                      std::nullopt, steps, step_time, 0, stall);
  using WhenBusy = CheckpointManagerOptions::WhenBusy;
  const LoopResult wait =
      RunLoop(*backend, model, root + "/wait", WhenBusy::kWait, steps,
              step_time, stall_at, stall);
  const LoopResult skip =
      RunLoop(*backend, model, root + "/skip", WhenBusy::kSkip, steps,
              step_time, stall_at, stall);
  if (own_root) std::filesystem::remove_all(root);

  const auto row = [&](const LoopResult& r) {
    return nlohmann::json{{"wall_s", r.wall_s},
                          {"wall_ratio", r.wall_s / baseline.wall_s},
                          {"max_blocked_s", r.max_blocked_s},
                          {"median_blocked_s", r.median_blocked_s},
                          {"skipped", r.skipped},
                          {"max_lag_s", r.max_lag_s},
                          {"committed_kept", r.committed},
                          {"verified", r.verified}};
  };
  if (json) {
    std::cout << nlohmann::json{{"bytes", bytes},
                                {"steps", steps},
                                {"stall_s", absl::ToDoubleSeconds(stall)},
                                {"baseline_wall_s", baseline.wall_s},
                                {"wait", row(wait)},
                                {"skip", row(skip)}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << absl::StrFormat(
        "%d steps of %s, a %s save each; storage stuck for %s from step %d\n"
        "%-8s %10s %8s %13s %14s %8s %12s %9s\n",
        steps, step_text, FormatBytes(static_cast<double>(bytes)), stall_text,
        stall_at, "policy", "loop", "ratio", "max blocked", "median blocked",
        "skipped", "max lag", "verified");
    std::cout << absl::StrFormat("%-8s %9.2fs %7.2fx\n", "no saves",
                                 baseline.wall_s, 1.0);
    for (const auto& [name, r] : {std::pair{"wait", wait}, {"skip", skip}}) {
      std::cout << absl::StrFormat(
          "%-8s %9.2fs %7.2fx %12.3fs %13.4fs %8d %11.2fs %9s\n", name,
          r.wall_s, r.wall_s / baseline.wall_s, r.max_blocked_s,
          r.median_blocked_s, r.skipped, r.max_lag_s,
          r.verified ? "yes" : "NO");
    }
  }
  return wait.verified && skip.verified ? 0 : 1;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
