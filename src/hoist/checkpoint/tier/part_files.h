// A part of a local-tier step, or a peer's copy of one, as the local tier
// moves its extents (local_tier.h): opened to send extents, packed into
// files of a copy, committed on the receiving side. Internal to the local
// tier (local_tier.cc saves, local_tier_restore.cc restores).
#ifndef HOIST_CHECKPOINT_TIER_PART_FILES_H_
#define HOIST_CHECKPOINT_TIER_PART_FILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "hoist/checkpoint/tier/peer_shift.h"
#include "hoist/checkpoint/tier/replica_plan.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// Length-prefixed records ("<size>:<bytes>"), for messages between ranks
// whose fields may hold any byte; kDataLoss naming `what` for text that is
// not such records.
void AppendRecord(std::string& out, absl::string_view record);
absl::StatusOr<std::vector<absl::string_view>> SplitRecords(
    absl::string_view text, absl::string_view what);

// A (small) file's bytes, mapped and copied.
absl::StatusOr<std::string> ReadText(const std::string& path);

// The data file of a copy made by rank `rank` of rank `origin`'s part's
// extents (its own part's: origin == rank).
std::string CopyFileName(int rank, int origin);

// Offsets of extents of `lengths` bytes laid one after another in a file,
// each at a multiple of kExtentAlignmentBytes.
std::vector<int64_t> PackedOffsets(const std::vector<int64_t>& lengths);

// The (array, extent) of each extent of `manifest`, in PartExtents' order.
std::vector<std::pair<int, int>> ExtentPlaces(const Manifest& manifest);

// The manifest of a copy of `part` holding its extents `indices` (into
// ExtentPlaces, ascending) packed into the data file `file`
// (PackedOffsets). kInvalidArgument for an index past its extents.
absl::StatusOr<Manifest> ManifestOfCopy(const Manifest& part,
                                        const std::vector<int>& indices,
                                        const std::string& file);

// A part, or a copy of one, held by this rank and opened to send extents.
struct HeldPart {
  std::string dir;
  Manifest manifest;
  std::vector<PartExtent> extents;         // PartExtents(manifest)
  std::vector<std::pair<int, int>> where;  // ExtentPlaces(manifest)
  std::unordered_map<std::string, int> by_key;
  std::map<std::string, MappedFile> files;  // mapped on first use
};

// Reads and validates the part in step directory `dir`.
absl::StatusOr<std::unique_ptr<HeldPart>> OpenHeldPart(Storage& storage,
                                                       const std::string& dir);

// The bytes of extent `i` of `part`, in its mapped data file (valid while
// `part` lives). kDataLoss for an extent past its file's end.
absl::StatusOr<absl::Span<const uint8_t>> ExtentBytes(HeldPart& part, int i);

// A data file `path` of `part`'s extents `indices` (in that order), each
// at the offset PackedOffsets gives it, zeros between.
absl::StatusOr<OutgoingFile> PackedFile(HeldPart& part, std::string path,
                                        const std::vector<int>& indices);

// Begins step `step` under `root` as the storage commits a step
// (Storage::BeginDir): its temporary directory, with data/, replacing what
// an earlier try left there. CommitStep (save.h) commits it.
absl::StatusOr<std::string> MakeTmpStep(Storage& storage,
                                        const std::string& root, int64_t step);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_PART_FILES_H_
