#include "hoist/checkpoint/restore/verify.h"

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/references_file.h"
#include "hoist/io/io_sizes.h"

namespace hoist {
namespace {

// A problem where the step's REFERENCES.json (none: a step an older hoist
// wrote) does not check, or lists other files than its manifest reads in
// other steps: retention would trust it.
std::optional<std::string> ReferencesProblem(Storage& storage,
                                             const std::string& step_dir,
                                             const Manifest& manifest) {
  absl::StatusOr<std::vector<std::string>> listed =
      ReadReferencesFile(storage, step_dir, manifest.step);
  if (absl::IsNotFound(listed.status())) return std::nullopt;
  if (!listed.ok()) return listed.status().ToString();
  const std::vector<std::string> read = FilesReferenced(manifest);
  if (*listed == read) return std::nullopt;
  return absl::StrFormat(
      "%s lists %d files of other steps, but the manifest reads %d others",
      std::string(kReferencesFileName), listed->size(), read.size());
}

}  // namespace

VerifyReport VerifyCheckpoint(Storage& storage, const std::string& step_dir,
                              OperationProgress* progress) {
  VerifyReport report;
  absl::StatusOr<Manifest> manifest = ReadManifestFile(storage, step_dir);
  if (!manifest.ok()) {
    report.problems.push_back(manifest.status().ToString());
    return report;
  }
  if (std::optional<std::string> problem =
          ReferencesProblem(storage, step_dir, *manifest)) {
    report.problems.push_back(*std::move(problem));
  }
  OperationProgress ignored;
  OperationProgress& counted = progress != nullptr ? *progress : ignored;
  int64_t total = 0;
  for (const ManifestArray& array : manifest->arrays) {
    for (const ManifestExtent& extent : array.extents) {
      total += extent.length_bytes;
    }
  }
  counted.total.store(total);
  absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
  absl::flat_hash_map<std::string, absl::Status> unopenable;
  ReadBuffer buffer;
  for (const ManifestArray& array : manifest->arrays) {
    ++report.arrays;
    counted.current.Set(array.name);
    for (size_t e = 0; e < array.extents.size(); ++e) {
      const ManifestExtent& extent = array.extents[e];
      // Counted whole once over, read or not.
      const int64_t done = counted.done.load() + extent.length_bytes;
      const absl::Cleanup count = [&] { counted.done.store(done); };
      const ExtentPlace place = PlaceOfExtent(step_dir, extent);
      const std::string where = absl::StrFormat(
          "array '%s': extent %d of %d (%s @ %d)", array.name, e,
          array.extents.size(), place.relative, extent.offset_bytes);
      if (unopenable.contains(place.path)) continue;  // reported once
      std::unique_ptr<ReadableFile>& file = files[place.path];
      if (file == nullptr) {
        absl::StatusOr<std::unique_ptr<ReadableFile>> opened =
            storage.OpenReadableBeneath(place.dir, place.relative);
        if (!opened.ok()) {
          report.problems.push_back(
              absl::StrFormat("%s: %s", where, opened.status().ToString()));
          unopenable.emplace(place.path, opened.status());
          files.erase(place.path);
          continue;
        }
        file = *std::move(opened);
      }
      ++report.extents;
      // Pieces of at most 16 MiB: a manifest's claim never sizes a buffer.
      const absl::Status read = ReadExtentInPieces(
          *file, extent, ItemSize(array.dtype), kMaxIoRunBytes, buffer,
          [&](const Box& piece, const uint8_t*) {
            counted.done.fetch_add(piece.num_elements() * ItemSize(array.dtype),
                                   std::memory_order_relaxed);
          });
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
