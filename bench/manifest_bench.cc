// Manifest decoding cost against the number of extents: one array cut into
// a grid of one-element extents (the most extents per byte a manifest can
// have), decoded from its JSON text. Decoding validates every extent and
// checks that they tile the array; both must grow near-linearly, so the
// time per extent (the "per_extent" counter) should stay flat as the count
// grows 100-fold.
//
// BM_EncodeManyArrays: encoding, as the saver does for every step, a
// manifest of N arrays of one extent each with a Python save's tree
// metadata.
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
                               (r * cols + c) * 4096, 1, ExtentHash{},
                               std::nullopt});
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

// A many-array manifest (a large MoE's optimizer state: N arrays of one
// extent each, with the tree metadata a Python save writes), encoded as the
// saver does for every step.
Manifest ManyArrays(int64_t arrays) {
  Manifest manifest;
  manifest.step = 7;
  std::string tree = R"({"hoist.python": 1, "tree": {"d": [)";
  for (int64_t i = 0; i < arrays; ++i) {
    const std::string name =
        "experts/" + std::to_string(i / 64) + "/m" + std::to_string(i % 64);
    manifest.arrays.push_back(
        {name,
         DType::kFloat32,
         {256},
         R"({"explicit": [[0, [0], [256]]]})",
         {{Box({0}, {256}), "data/r00000_w00.bin", i * 4096, 1024,
           ExtentHash{.low = 0x0123456789abcdefULL + static_cast<uint64_t>(i)},
           std::nullopt}}});
    if (i > 0) tree += ", ";
    tree += R"([")" + name + R"(", {"a": ")" + name + R"(", "k": "numpy"}])";
  }
  manifest.metadata_json = tree + "]}}";
  return manifest;
}

void BM_EncodeManyArrays(benchmark::State& state) {
  const Manifest manifest = ManyArrays(state.range(0));
  size_t bytes = 0;
  for (auto _ : state) {
    absl::StatusOr<std::string> text = EncodeManifest(manifest);
    if (!text.ok()) {
      state.SkipWithError(std::string(text.status().message()).c_str());
      return;
    }
    bytes = text->size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["MiB"] = static_cast<double>(bytes) / (1 << 20);
  state.counters["per_array"] =
      benchmark::Counter(static_cast<double>(state.range(0)),
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
}
BENCHMARK(BM_EncodeManyArrays)
    ->RangeMultiplier(10)
    ->Range(10000, 100000)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hoist

BENCHMARK_MAIN();
