// One step's manifest at many ranks, by simulation (no processes): the
// manifest a job of --ranks ranks writes when each of --arrays arrays is
// sharded over every rank (one extent per rank per array, in its rank's
// data file), built in memory and encoded as a save's rank 0 does (split,
// hoist/3, above 65,536 extents; --document: one JSON document, hoist/2),
// written to a step directory under --dir, then read back as readers do:
// its head (ls, inspect, PrepareRestore), one array's extents (a names=
// restore of one array), and the whole manifest (verify; a restore of
// every array). Prints one JSON object: extents, bytes, seconds, and
// memory (the peak RSS the build and encoding reached; for each read, the
// RSS it added while its result is held).
//
//   build/release/bench/manifest_scale --ranks 16384 --arrays 1000

#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "hoist/format/manifest_file.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"
#include "nlohmann/json.hpp"

namespace hoist {
namespace {

using bench::Check;
using bench::PeakRssBytes;
using bench::Since;

// This process's resident memory now (VmRSS), what the allocator holds
// free given back first.
int64_t RssBytes() {
  malloc_trim(0);
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) << 10;
  }
  return 0;
}

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

struct Options {
  int ranks = 16384;
  int arrays = 1000;
  bool document = false;  // hoist/2, one JSON document
  bool whole = true;      // also read the whole manifest back
  std::string dir = std::filesystem::temp_directory_path().string();
};

int Run(const Options& options) {
  nlohmann::json out = {{"ranks", options.ranks}, {"arrays", options.arrays}};
  const int64_t base_rss = PeakRssBytes();
  auto start = std::chrono::steady_clock::now();
  std::string text;
  std::string one_name;
  {
    const Manifest manifest = Simulated(options.ranks, options.arrays);
    out["build_s"] = Since(start);
    out["in_memory_peak_rss_bytes"] = PeakRssBytes() - base_rss;
    one_name = manifest.arrays[manifest.arrays.size() / 2].name;
    start = std::chrono::steady_clock::now();
    text = Check(EncodeManifest(
        manifest, {.split_above_extents =
                       options.document ? INT64_MAX : kSplitManifestExtents}));
    out["encode_s"] = Since(start);
  }
  out["extents"] = static_cast<int64_t>(options.ranks) * options.arrays;
  out["manifest_bytes"] = static_cast<int64_t>(text.size());
  out["encode_peak_rss_bytes"] = PeakRssBytes() - base_rss;

  // The step directory a save's commit leaves.
  const std::string root = absl::StrFormat(
      "%s/hoist_manifest_scale_%d", options.dir, static_cast<int>(getpid()));
  const std::string step_dir = root + "/step_00001000";
  std::filesystem::create_directories(step_dir);
  {
    std::ofstream file(step_dir + "/MANIFEST.json", std::ios::binary);
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!file.flush()) {
      std::cerr << "manifest_scale: could not write " << step_dir << "\n";
      return 1;
    }
  }
  text = std::string();
  std::unique_ptr<Storage> storage = MakePosixStorage();

  int64_t rss = RssBytes();
  start = std::chrono::steady_clock::now();
  {
    const ManifestHead head = Check(ReadManifestHead(*storage, step_dir));
    out["format"] = std::string(head.format);
    out["head_s"] = Since(start);
    out["head_bytes"] = head.split ? head.sections_at : head.file_bytes;
    out["head_rss_bytes"] = RssBytes() - rss;
  }
  rss = RssBytes();
  start = std::chrono::steady_clock::now();
  {
    const Manifest one =
        Check(ReadManifestArrays(*storage, step_dir, {one_name}));
    out["one_array_s"] = Since(start);
    out["one_array_extents"] = one.arrays.at(0).extents.size();
    out["one_array_rss_bytes"] = RssBytes() - rss;
  }
  if (options.whole) {
    rss = RssBytes();
    start = std::chrono::steady_clock::now();
    const Manifest whole = Check(ReadManifestFile(*storage, step_dir));
    out["whole_s"] = Since(start);
    out["whole_rss_bytes"] = RssBytes() - rss;
  }
  std::filesystem::remove_all(root);
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace
}  // namespace hoist

int main(int argc, char** argv) {
  CLI::App app{
      "One step's manifest at many ranks, by simulation: build and encode a "
      "manifest of RANKS x ARRAYS extents, write it, and read back its head, "
      "one array and the whole; prints JSON."};
  hoist::Options options;
  app.add_option("--ranks", options.ranks, "Ranks of the simulated job")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--arrays", options.arrays,
                 "Arrays, each sharded over every rank")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--document", options.document,
               "Write one JSON document (hoist/2), as before hoist/3");
  app.add_flag("!--no-whole", options.whole,
               "Skip reading the whole manifest back");
  app.add_option("--dir", options.dir,
                 "Where the step directory is written (then removed)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return hoist::Run(options);
}
