// One step's manifest at many ranks, by simulation (no processes): the
// manifest a job of --ranks ranks writes when each of --arrays arrays is
// sharded over every rank (one extent per rank per array, in its rank's
// data file), built in memory, encoded and decoded as a save's rank 0 and
// a restoring rank do. Prints one JSON object: extents, the text's bytes,
// seconds to encode and decode, and the peak RSS each step reached.
//
//   build/release/bench/manifest_scale --ranks 16384 --arrays 1000

#include <chrono>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "hoist/manifest.h"
#include "nlohmann/json.hpp"

namespace hoist {
namespace {

using bench::PeakRssBytes;
using bench::Since;

// Each array: float32, 4,096 elements (16 KiB) per rank; rank r's extent
// at its place in rank r's file, with a hash of its own.
Manifest Simulated(int ranks, int arrays) {
  constexpr int64_t kElements = 4096;
  Manifest manifest;
  manifest.step = 1000;
  std::vector<std::string> files;
  for (int r = 0; r < ranks; ++r) {
    files.push_back(absl::StrFormat("data/r%05d_w00.bin", r));
  }
  for (int a = 0; a < arrays; ++a) {
    ManifestArray array{absl::StrFormat("model/layers/%d/mlp/w", a),
                        DType::kFloat32,
                        {ranks * kElements},
                        R"({"mesh": {"data": 1}, "spec": [["data"]]})",
                        {}};
    array.extents.reserve(ranks);
    for (int r = 0; r < ranks; ++r) {
      const uint64_t seed = static_cast<uint64_t>(a) * ranks + r;
      array.extents.push_back({Box({r * kElements}, {kElements}), files[r],
                               static_cast<int64_t>(a) * kElements * 4,
                               kElements * 4,
                               ExtentHash{.low = seed * 0x9e3779b97f4a7c15ULL,
                                          .high = ~seed * 0xc2b2ae3d27d4eb4fULL,
                                          .wide = true},
                               std::nullopt});
    }
    manifest.arrays.push_back(std::move(array));
  }
  return manifest;
}

int Run(int ranks, int arrays) {
  nlohmann::json out = {{"ranks", ranks}, {"arrays", arrays}};
  const int64_t base_rss = PeakRssBytes();
  auto start = std::chrono::steady_clock::now();
  std::string text;
  {
    const Manifest manifest = Simulated(ranks, arrays);
    out["build_s"] = Since(start);
    out["in_memory_peak_rss_bytes"] = PeakRssBytes() - base_rss;
    start = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> encoded = EncodeManifest(manifest);
    if (!encoded.ok()) {
      std::cerr << "manifest_scale: " << encoded.status() << "\n";
      return 1;
    }
    out["encode_s"] = Since(start);
    text = *std::move(encoded);
  }
  out["extents"] = static_cast<int64_t>(ranks) * arrays;
  out["manifest_bytes"] = static_cast<int64_t>(text.size());
  out["encode_peak_rss_bytes"] = PeakRssBytes() - base_rss;
  start = std::chrono::steady_clock::now();
  absl::StatusOr<Manifest> decoded = DecodeManifest(text);
  if (!decoded.ok()) {
    std::cerr << "manifest_scale: " << decoded.status() << "\n";
    return 1;
  }
  out["decode_s"] = Since(start);
  out["decode_peak_rss_bytes"] = PeakRssBytes() - base_rss;
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) {
  CLI::App app{
      "One step's manifest at many ranks, by simulation: build, encode and "
      "decode a manifest of RANKS x ARRAYS extents; prints JSON."};
  int ranks = 16384, arrays = 1000;
  app.add_option("--ranks", ranks, "Ranks of the simulated job")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--arrays", arrays, "Arrays, each sharded over every rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  return hoist::Run(ranks, arrays);
}
