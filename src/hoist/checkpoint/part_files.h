// A part of a local-tier step, or a peer's copy of one, as the local tier
// moves its extents (local_tier.h): opened to send extents, packed into
// files of a copy, committed on the receiving side. Internal to the local
// tier (local_tier.cc saves, local_tier_restore.cc restores).
#ifndef HOIST_CHECKPOINT_PART_FILES_H_
#define HOIST_CHECKPOINT_PART_FILES_H_

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
#include "hoist/checkpoint/peer_shift.h"
#include "hoist/checkpoint/replica_plan.h"
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

// A part, or a copy of one, held by this rank and opened to send extents.
struct HeldPart {
  std::string dir;
  Manifest manifest;
  std::vector<PartExtent> extents;         // PartExtents(manifest)
  std::vector<std::pair<int, int>> where;  // (array, extent) of each
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

// Writes `text` to a new file `path`, synced.
absl::Status WriteSynced(Storage& storage, const std::string& path,
                         absl::string_view text);

// Creates the temporary directory of `step` under `root`, with data/
// (replacing what an earlier try left there).
absl::StatusOr<std::string> MakeTmpStep(Storage& storage,
                                        const std::string& root, int64_t step);

// Syncs the temporary step directory `tmp` and renames it to step `step` of
// `root`, replacing it; removes `tmp` on an error.
absl::Status Publish(Storage& storage, const std::string& root, int64_t step,
                     const std::string& tmp);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_PART_FILES_H_
