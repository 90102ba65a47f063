// Delta checkpoints: an extent whose bytes did not change since the newest
// committed step is recorded as a reference to that step's bytes instead of
// being written again (docs/delta.md).
//
//   - The save (save.cc) asks rank 0 for the base: the newest committed
//     step other than the one being saved. Every process reads the base's
//     manifest and, per slice of its plan, the base's extent of the same
//     array, dtype, shape and box (MakeDeltaBase). The ExtentWriter hashes
//     each staged extent (XXH3-128) and, when the hash equals that extent's,
//     releases it unwritten; the manifest then points at the base's bytes:
//     at the step that wrote them (a reference never points at a
//     reference, so a restore follows at most one hop).
//   - A step whose manifest is pruned while kept steps reference its data
//     files keeps those files (and only those) in its directory, without a
//     manifest: a "referenced" step, not a checkpoint. Its files go once no
//     committed manifest references them (PruneReferenced).
#ifndef HOIST_CHECKPOINT_SAVE_DELTA_H_
#define HOIST_CHECKPOINT_SAVE_DELTA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "hoist/format/manifest_index.h"
#include "hoist/manifest.h"
#include "hoist/save_plan.h"
#include "hoist/storage.h"

namespace hoist {

// What a save may reference instead of writing: per slice of its plan, the
// base step's extent of the same array (name, dtype, shape) and box
// (WriterOf: the step whose directory holds its bytes); null where there is
// none, or where the base's hash is only XXH3-64 (hoist/1).
// `frozen` (when given, per slice) marks the frozen arrays' slices: their
// bytes must equal the base's (the writer fails the save when they do not).
struct DeltaBase {
  int64_t step = -1;
  // Per plan slice, the base's extent (in `manifest`), or null.
  std::vector<const ManifestExtent*> extents;
  std::vector<uint8_t> frozen;                      // by plan slice
  std::shared_ptr<const IndexedManifest> manifest;  // holds `extents`

  // The step whose directory holds slice `s`'s base bytes (never a
  // reference: one hop).
  int64_t WriterOf(size_t s) const { return extents[s]->step.value_or(step); }
  // Slice `s`'s base extent as a new step references it.
  ManifestExtent Reference(size_t s) const {
    ManifestExtent extent = *extents[s];
    extent.step = WriterOf(s);
    return extent;
  }
};
// O(slices), pointing into `base` (which it keeps): one indexed lookup per
// array, one box comparison per slice when `base` was saved from the same
// plan (else a map of the array's extents by box). With `process`, only
// that process's slices are looked up (the others stay null): what a rank
// other than 0 writes with, from a base that holds only its own extents
// (SaveResult::manifest).
DeltaBase MakeDeltaBase(const SavePlan& plan,
                        std::shared_ptr<const IndexedManifest> base,
                        const std::vector<uint8_t>* frozen = nullptr,
                        std::optional<int> process = std::nullopt);

// The newest step committed under `root` other than `except`, or nullopt.
absl::StatusOr<std::optional<int64_t>> NewestCommittedStep(
    Storage& storage, const std::string& root, int64_t except);

// The steps committed under `root`, ascending.
absl::StatusOr<std::vector<int64_t>> CommittedSteps(Storage& storage,
                                                    const std::string& root);

// The data files of other steps' directories that committed step `step`
// under `root` reads (FilesReferenced), from its REFERENCES.json where it
// has one that checks, else from its manifest (of a split manifest, only
// the sections of arrays with references).
absl::StatusOr<std::vector<std::string>> FilesReadByStep(
    Storage& storage, const std::string& root, int64_t step);

// The data files that the committed steps under `root` (`except` left
// out; -1: none) read in other steps' directories, by reference: what a
// step directory without a manifest must keep (FilesReadByStep of each).
absl::StatusOr<absl::flat_hash_set<std::string>> FilesReadByCommitted(
    Storage& storage, const std::string& root, int64_t except = -1);

// The committed steps (other than `step`) that read a file of `step`'s.
absl::StatusOr<std::vector<int64_t>> StepsReferencing(Storage& storage,
                                                      const std::string& root,
                                                      int64_t step);

// For each step in `steps` whose directory under `root` has no manifest (a
// referenced step, or one being pruned): removes its data files that no
// path in `live` names, and the whole directory once none is left. A step
// directory with a manifest is left alone. Makes the removals durable.
absl::Status PruneReferenced(Storage& storage, const std::string& root,
                             const std::vector<int64_t>& steps,
                             const absl::flat_hash_set<std::string>& live);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_DELTA_H_
