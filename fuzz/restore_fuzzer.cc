// libFuzzer target: restore planning and reading against arbitrary
// manifests. The input is a manifest (up to the first NUL) and the bytes
// that stand for every data file. The step lives in a MemoryStorage; every
// array of a valid manifest whose bytes stay under 1 MiB is restored into
// host memory, whole and in two halves along its first dimension; a larger
// one (the manifest may claim any size) only its first element, so its
// extents are read through restore's bounded buffers. Then the step is
// verified. Restore must fail with a status (usually a hash mismatch) or
// succeed; nothing may crash, read outside what it was given, or allocate
// from the manifest's claims (libFuzzer's -malloc_limit_mb catches that).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/restore/verify.h"
#include "hoist/host_backend.h"
#include "hoist/io/memory_storage.h"
#include "hoist/manifest.h"

namespace {

hoist::Backend& Backend() {
  static hoist::Backend* backend =
      hoist::MakeHostBackend({.num_devices = 1})->release();
  return *backend;
}

hoist::StagingPool& Pool() {
  static hoist::StagingPool* pool =
      hoist::StagingPool::Create(Backend(), 1 << 20)->release();
  return *pool;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t text_size = nul == nullptr ? size : nul - data;
  const std::string text(reinterpret_cast<const char*>(data), text_size);
  const std::string bytes =
      nul == nullptr ? std::string()
                     : std::string(reinterpret_cast<const char*>(nul + 1),
                                   size - text_size - 1);
  absl::StatusOr<hoist::Manifest> manifest = hoist::DecodeManifest(text);
  if (!manifest.ok()) return 0;

  hoist::MemoryStorage storage;
  (void)storage.CreateDir("/step");
  auto write = [&](const std::string& path, const std::string& contents) {
    // Create the directories on the way.
    for (size_t at = path.find('/', 1); at != std::string::npos;
         at = path.find('/', at + 1)) {
      (void)storage.CreateDir(path.substr(0, at));
    }
    auto file = storage.OpenWritable(path);
    if (!file.ok()) return;
    (void)(*file)->WriteAt(
        0, absl::Span<const uint8_t>(
               reinterpret_cast<const uint8_t*>(contents.data()),
               contents.size()));
  };
  write("/step/MANIFEST.json", text);
  std::set<std::string> files;
  for (const auto& array : manifest->arrays) {
    for (const auto& extent : array.extents) files.insert(extent.file);
  }
  for (const std::string& file : files) write("/step/" + file, bytes);

  std::vector<std::vector<uint8_t>> memory;
  std::vector<hoist::RestoreTarget> targets;
  for (const auto& array : manifest->arrays) {
    const hoist::Box whole = hoist::Box::FromShape(array.shape);
    const int64_t total = whole.num_elements() * hoist::ItemSize(array.dtype);
    hoist::RestoreTarget target{array.name, array.dtype, array.shape, {}};
    if (total > (1 << 20)) {
      const hoist::Box first(std::vector<int64_t>(whole.rank(), 0),
                             std::vector<int64_t>(whole.rank(), 1));
      memory.emplace_back(hoist::ItemSize(array.dtype));
      target.destinations.push_back({first, nullptr, memory.back().data()});
    } else if (whole.rank() > 0 && whole.shape()[0] >= 2) {
      for (const hoist::Box& half : whole.Split(0, 2)) {
        memory.emplace_back(half.num_elements() * hoist::ItemSize(array.dtype));
        target.destinations.push_back({half, nullptr, memory.back().data()});
      }
    } else {
      memory.emplace_back(std::max<int64_t>(total, 1));
      target.destinations.push_back({whole, nullptr, memory.back().data()});
    }
    targets.push_back(std::move(target));
  }
  (void)hoist::RestoreCheckpoint(storage, "/step", targets, Pool(),
                                 {.reader_threads = 2});
  (void)hoist::VerifyCheckpoint(storage, "/step");
  return 0;
}
