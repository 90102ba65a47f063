#include "hoist/checkpoint/verify.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "hoist/checkpoint/extent_reader.h"
#include "hoist/checkpoint/io_sizes.h"
#include "hoist/checkpoint/save.h"
#include "hoist/format/manifest_file.h"

namespace hoist {

VerifyReport VerifyCheckpoint(Storage& storage, const std::string& step_dir) {
  VerifyReport report;
  absl::StatusOr<Manifest> manifest = ReadManifestFile(storage, step_dir);
  if (!manifest.ok()) {
    report.problems.push_back(manifest.status().ToString());
    return report;
  }
  absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
  absl::flat_hash_map<std::string, absl::Status> unopenable;
  ReadBuffer buffer;
  for (const ManifestArray& array : manifest->arrays) {
    ++report.arrays;
    for (size_t e = 0; e < array.extents.size(); ++e) {
      const ManifestExtent& extent = array.extents[e];
      const std::string where = absl::StrFormat(
          "array '%s': extent %d of %d (%s @ %d)", array.name, e,
          array.extents.size(), extent.file, extent.offset_bytes);
      if (unopenable.contains(extent.file)) continue;  // reported once
      std::unique_ptr<ReadableFile>& file = files[extent.file];
      if (file == nullptr) {
        absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
            storage.OpenReadableBeneath(step_dir, extent.file);
        if (!opened.ok()) {
          report.problems.push_back(
              absl::StrFormat("%s: %s", where, opened.status().ToString()));
          unopenable.emplace(extent.file, opened.status());
          files.erase(extent.file);
          continue;
        }
        file = *std::move(opened);
      }
      ++report.extents;
      // Pieces of at most 16 MiB: a manifest's claim never sizes a buffer.
      const absl::Status read = ReadExtentInPieces(
          *file, extent, ItemSize(array.dtype), kMaxIoRunBytes, buffer,
          [](const Box&, const uint8_t*) {});
      if (!read.ok()) {
        report.problems.push_back(
            absl::StrFormat("%s: %s", where, read.ToString()));
        continue;
      }
      report.bytes += extent.length_bytes;
    }
  }
  return report;
}

}  // namespace hoist
