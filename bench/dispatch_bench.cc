// bench/dispatch_bench: how the training thread's part of a
// dispatched-mode save grows with the number of arrays, for arrays handed
// to every save (Save(step, arrays): the caller's shards are walked and
// their specs compared with the cached plan's at each save) and for arrays
// registered once (Register, then Save(step, registered): nothing is read
// per array, and each device's copies were prepared at the first save).
//
// Per --arrays count N: N arrays of --array-bytes on 8 host devices, each
// split into --shards pieces on consecutive devices. Each save is preceded
// by a "training step" that rewrites --evict bytes of other memory, as a
// real step evicts the caller's arrays and the cached plan from the
// caches. A save's blocked time is Save()'s, in dispatched mode; the loop
// then waits for its commit before the next. The first save of each kind
// plans (and, registered, prepares the copies) and is reported apart; of
// the --saves after it, the median and the largest. The ratio is
// registered / given in the same run.
//
//   build/release/bench/dispatch_bench [--arrays 1000,10000,100000]
//       [--shards 1] [--array-bytes 1024] [--saves 10] [--evict 64MiB]
//       [--root DIR] [--json]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/host_backend.h"
#include "hoist/model/synthetic.h"

namespace hoist {
namespace {

using bench::Check;
using bench::Die;

constexpr int kDevices = 8;

struct Model {
  std::vector<std::vector<uint8_t>> memory;  // per shard
  std::vector<SaveArray> arrays;
};

// `count` arrays of `bytes`, each in `shards` pieces along its one axis,
// piece k of array i on device (i + k) % 8.
Model MakeModel(Backend& backend, int count, int shards, int64_t bytes) {
  Model model;
  model.memory.reserve(static_cast<size_t>(count) * shards);
  const int64_t piece = bytes / shards;
  for (int i = 0; i < count; ++i) {
    ExplicitSharding sharding;
    SaveArray array;
    for (int k = 0; k < shards; ++k) {
      const DeviceId device = backend.devices()[(i + k) % kDevices]->id();
      sharding.shards.push_back({device, Box({k * piece}, {piece})});
      model.memory.emplace_back(piece);
      FillSynthetic(model.memory.back().data(), piece, i * shards + k);
      array.shards.push_back({device, model.memory.back().data()});
    }
    array.spec = {absl::StrFormat("layers/%06d/w", i),
                  DType::kUint8,
                  {piece * shards},
                  sharding};
    model.arrays.push_back(std::move(array));
  }
  return model;
}

struct Figures {
  double first_s = 0;   // the first save: plans (and prepares)
  double median_s = 0;  // of the saves after it
  double max_s = 0;
  double register_s = 0;  // Register (registered only)
};

Figures Run(CheckpointManager& manager, const Model& model, bool registered,
            int saves, std::vector<uint8_t>& evict, int64_t& step) {
  Figures figures;
  std::optional<RegisteredArrays> registration;
  if (registered) {
    const absl::Time start = absl::Now();
    registration = Check(manager.Register(model.arrays));
    figures.register_s = absl::ToDoubleSeconds(absl::Now() - start);
  }
  std::vector<double> blocked;
  for (int s = 0; s <= saves; ++s) {
    // The training step: other memory rewritten.
    for (size_t at = 0; at < evict.size(); at += 64) ++evict[at];
    ++step;
    const absl::Time start = absl::Now();
    SaveHandle handle = Check(
        registered
            ? manager.Save(step, *registration, "{}", ReturnWhen::kDispatched)
            : manager.Save(step, model.arrays, "{}", ReturnWhen::kDispatched));
    const double took = absl::ToDoubleSeconds(absl::Now() - start);
    if (s == 0) {
      figures.first_s = took;
    } else {
      blocked.push_back(took);
    }
    Check(handle.WaitCommitted());
  }
  std::sort(blocked.begin(), blocked.end());
  figures.median_s = blocked[blocked.size() / 2];
  figures.max_s = blocked.back();
  return figures;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "The training thread's part of a dispatched-mode save, by "
      "number of arrays: given to every save vs registered once"};
  std::string counts = "1000,10000,100000";
  int shards = 1;
  std::string array_bytes = "1KiB";
  int saves = 10;
  std::string evict_size = "64MiB";
  std::string root;
  bool json = false;
  app.add_option("--arrays", counts, "Array counts, comma-separated")
      ->capture_default_str();
  app.add_option("--shards", shards, "Shards per array (1-8)")
      ->capture_default_str()
      ->check(CLI::Range(1, kDevices));
  app.add_option("--array-bytes", array_bytes, "Bytes per array")
      ->capture_default_str();
  app.add_option("--saves", saves, "Saves measured per kind, after the first")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--evict", evict_size,
                 "Memory the training step rewrites before each save")
      ->capture_default_str();
  app.add_option("--root", root,
                 "Checkpoint root (default: a new directory here, removed)");
  app.add_flag("--json", json, "Print JSON");
  CLI11_PARSE(app, argc, argv);

  const int64_t bytes = Check(ParseBytes(array_bytes));
  const int64_t evict_bytes = Check(ParseBytes(evict_size));
  if (bytes < shards) Die(absl::InvalidArgumentError("--array-bytes < shards"));
  std::vector<int> ns;
  for (absl::string_view n : absl::StrSplit(counts, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(n, &v) || v < 1) {
      Die(absl::InvalidArgumentError(absl::StrCat("--arrays: ", n)));
    }
    ns.push_back(v);
  }
  const bool own_root = root.empty();
  if (own_root) root = absl::StrFormat("dispatch-bench.%d", getpid());
  std::unique_ptr<Backend> backend =
      Check(MakeHostBackend({.num_devices = kDevices}));
  std::unique_ptr<Coordinator> coordinator = MakeSingleProcessCoordinator();
  std::vector<uint8_t> evict(evict_bytes, 1);

  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    std::cout << absl::StrFormat("%8s %7s | %-10s %9s %9s %9s %9s | %s\n",
                                 "arrays", "slices", "arrays", "first",
                                 "median", "max", "register", "median ratio");
  }
  for (int n : ns) {
    const Model model = MakeModel(*backend, n, shards, bytes);
    // Every slice in one wave: 4 KiB-aligned, with room to spare.
    CheckpointManagerOptions options;
    options.pool_bytes =
        static_cast<int64_t>(n) * shards * AlignUp(bytes / shards, 4096) * 2 +
        (int64_t{16} << 20);
    options.keep_last = 1;
    const std::string dir = absl::StrFormat("%s/%d", root, n);
    std::unique_ptr<CheckpointManager> manager =
        Check(CheckpointManager::Open(dir, *backend, *coordinator, options));
    int64_t step = 0;
    const Figures given = Run(*manager, model, false, saves, evict, step);
    const Figures registered = Run(*manager, model, true, saves, evict, step);
    manager.reset();
    std::filesystem::remove_all(dir);
    const double ratio = registered.median_s / given.median_s;
    const auto ms = [](double s) { return s * 1e3; };
    if (json) {
      const auto figures = [](const Figures& f) {
        return nlohmann::json{{"first_s", f.first_s},
                              {"median_s", f.median_s},
                              {"max_s", f.max_s},
                              {"register_s", f.register_s}};
      };
      out.push_back({{"arrays", n},
                     {"slices", n * shards},
                     {"given", figures(given)},
                     {"registered", figures(registered)},
                     {"median_ratio", ratio}});
    } else {
      std::cout << absl::StrFormat(
          "%8d %7d | %-10s %7.3fms %7.3fms %7.3fms %9s |\n", n, n * shards,
          "given", ms(given.first_s), ms(given.median_s), ms(given.max_s), "");
      std::cout << absl::StrFormat(
          "%8s %7s | %-10s %7.3fms %7.3fms %7.3fms %7.1fms | %.3f\n", "", "",
          "registered", ms(registered.first_s), ms(registered.median_s),
          ms(registered.max_s), ms(registered.register_s), ratio);
    }
  }
  if (own_root) std::filesystem::remove_all(root);
  if (json) std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) { return hoist::Main(argc, argv); }
