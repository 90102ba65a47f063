// Manifest decoding cost against the number of extents: one array cut into
// a grid of one-element extents (the most extents per byte a manifest can
// have), decoded from its JSON text. Decoding validates every extent and
// checks that they tile the array; both must grow near-linearly, so the
// time per extent (the "per_extent" counter) should stay flat as the count
// grows 100-fold.
//
//   build/release/bench/manifest_bench
#include <benchmark/benchmark.h>

#include <cmath>

#include "hoist/manifest.h"

namespace hoist {
namespace {

std::string GridManifest(int64_t extents) {
  const int64_t cols = static_cast<int64_t>(std::sqrt(double(extents)));
  const int64_t rows = extents / cols;
  Manifest manifest;
  ManifestArray array{"grid", DType::kUint8, {rows, cols}, "", {}};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      array.extents.push_back({Box({r, c}, {1, 1}), "data/r00000_w00.bin",
                               (r * cols + c) * 4096, 1, 0});
    }
  }
  manifest.arrays.push_back(std::move(array));
  return EncodeManifest(manifest).value();
}

void BM_DecodeGridManifest(benchmark::State& state) {
  const std::string text = GridManifest(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Manifest> manifest = DecodeManifest(text);
    if (!manifest.ok()) {
      state.SkipWithError(std::string(manifest.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(manifest);
  }
  state.counters["MiB"] = static_cast<double>(text.size()) / (1 << 20);
  state.counters["per_extent"] =
      benchmark::Counter(static_cast<double>(state.range(0)),
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
}
BENCHMARK(BM_DecodeGridManifest)
    ->RangeMultiplier(10)
    ->Range(10000, 1000000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hoist

BENCHMARK_MAIN();
