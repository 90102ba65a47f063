// Parts of local-tier steps moved between processes: see part_files.h.
#include "hoist/checkpoint/tier/part_files.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"

namespace hoist {

// Length-prefixed records ("<size>:<bytes>"), for messages whose fields
// may hold any byte.
void AppendRecord(std::string& out, absl::string_view record) {
  absl::StrAppend(&out, record.size(), ":", record);
}

absl::StatusOr<std::vector<absl::string_view>> SplitRecords(
    absl::string_view text, absl::string_view what) {
  std::vector<absl::string_view> records;
  while (!text.empty()) {
    const size_t colon = text.find(':');
    size_t size = 0;
    if (colon == absl::string_view::npos ||
        !absl::SimpleAtoi(text.substr(0, colon), &size) ||
        size > text.size() - colon - 1) {
      return absl::DataLossError(
          absl::StrFormat("%s: a record is cut short", what));
    }
    records.push_back(text.substr(colon + 1, size));
    text.remove_prefix(colon + 1 + size);
  }
  return records;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return std::string(reinterpret_cast<const char*>(file.bytes().data()),
                     file.bytes().size());
}

// The data file of a copy made by rank `rank` of rank `origin`'s part's
// extents (its own part's: origin == rank).
std::string CopyFileName(int rank, int origin) {
  return rank == origin ? absl::StrFormat("%s/r%05d.bin", kDataDirName, rank)
                        : absl::StrFormat("%s/r%05d_of_r%05d.bin", kDataDirName,
                                          rank, origin);
}

// Offsets of extents of `lengths` bytes laid one after another in a file,
// each at a multiple of kExtentAlignmentBytes.
std::vector<int64_t> PackedOffsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (int64_t length : lengths) {
    offsets.push_back(AlignUp(end, kExtentAlignmentBytes));
    end = offsets.back() + length;
  }
  return offsets;
}

std::vector<std::pair<int, int>> ExtentPlaces(const Manifest& manifest) {
  std::vector<std::pair<int, int>> places;
  for (size_t a = 0; a < manifest.arrays.size(); ++a) {
    for (size_t e = 0; e < manifest.arrays[a].extents.size(); ++e) {
      places.push_back({static_cast<int>(a), static_cast<int>(e)});
    }
  }
  return places;
}

absl::StatusOr<Manifest> ManifestOfCopy(const Manifest& part,
                                        const std::vector<int>& indices,
                                        const std::string& file) {
  const std::vector<std::pair<int, int>> places = ExtentPlaces(part);
  Manifest copy;
  copy.step = part.step;
  copy.metadata_json = part.metadata_json;
  copy.part = part.part;
  std::vector<int64_t> lengths;
  for (int i : indices) {
    if (i < 0 || i >= static_cast<int>(places.size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "extent %d of a part of %d extents", i, places.size()));
    }
    const auto [a, e] = places[i];
    lengths.push_back(part.arrays[a].extents[e].length_bytes);
  }
  const std::vector<int64_t> offsets = PackedOffsets(lengths);
  int last_array = -1;
  for (size_t k = 0; k < indices.size(); ++k) {
    const auto [a, e] = places[indices[k]];
    const ManifestArray& array = part.arrays[a];
    if (a != last_array) {
      copy.arrays.push_back(
          {array.name, array.dtype, array.shape, array.sharding, {}});
      last_array = a;
    }
    ManifestExtent extent = array.extents[e];
    extent.file = file;
    extent.offset_bytes = offsets[k];
    copy.arrays.back().extents.push_back(std::move(extent));
  }
  return copy;
}

absl::StatusOr<std::unique_ptr<HeldPart>> OpenHeldPart(Storage& storage,
                                                       const std::string& dir) {
  auto part = std::make_unique<HeldPart>();
  part->dir = dir;
  ASSIGN_OR_RETURN(part->manifest, ReadManifestFile(storage, dir));
  part->where = ExtentPlaces(part->manifest);
  part->extents = PartExtents(part->manifest);
  for (size_t i = 0; i < part->extents.size(); ++i) {
    part->by_key.emplace(part->extents[i].key, static_cast<int>(i));
  }
  return part;
}

// The bytes of extent `i` of `part`, in its mapped data file.
absl::StatusOr<absl::Span<const uint8_t>> ExtentBytes(HeldPart& part, int i) {
  const auto [a, e] = part.where[i];
  const ManifestExtent& extent = part.manifest.arrays[a].extents[e];
  const std::string path = JoinPath(part.dir, extent.file);
  if (extent.step) {
    return absl::DataLossError(absl::StrFormat(
        "%s: array '%s' references step %d: a part holds its own bytes",
        part.dir, part.manifest.arrays[a].name, *extent.step));
  }
  auto it = part.files.find(extent.file);
  if (it == part.files.end()) {
    ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
    it = part.files.emplace(extent.file, std::move(file)).first;
  }
  const absl::Span<const uint8_t> bytes = it->second.bytes();
  if (extent.offset_bytes + extent.length_bytes >
      static_cast<int64_t>(bytes.size())) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but array '%s' %s ends at %d", path, bytes.size(),
        part.manifest.arrays[a].name, extent.box.ToString(),
        extent.offset_bytes + extent.length_bytes));
  }
  return bytes.subspan(extent.offset_bytes, extent.length_bytes);
}

// A data file `path` of `part`'s extents `indices` (in that order), packed.
absl::StatusOr<OutgoingFile> PackedFile(HeldPart& part, std::string path,
                                        const std::vector<int>& indices) {
  OutgoingFile file{std::move(path), {}};
  int64_t end = 0;
  for (int i : indices) {
    ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes, ExtentBytes(part, i));
    const int64_t at = AlignUp(end, kExtentAlignmentBytes);
    if (at > end) file.pieces.push_back(ZeroPadding(at - end));
    file.pieces.push_back(bytes);
    end = at + static_cast<int64_t>(bytes.size());
  }
  return file;
}

absl::StatusOr<std::string> MakeTmpStep(Storage& storage,
                                        const std::string& root, int64_t step) {
  const std::string tmp = JoinPath(root, TmpStepDirName(step));
  if (absl::StatusOr<bool> there = storage.Exists(tmp); there.ok() && *there) {
    RETURN_IF_ERROR(storage.RemoveAll(tmp));
  }
  const std::string subdirs[] = {kDataDirName};
  return storage.BeginDir(JoinPath(root, StepDirName(step)), tmp, subdirs,
                          std::string(kManifestFileName), /*replace=*/true);
}

}  // namespace hoist
