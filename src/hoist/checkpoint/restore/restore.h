// Restoring arrays of a committed step onto any sharding: each target names
// the boxes it wants and where they go (device memory or host memory); the
// saved extents that intersect them are read in parallel, verified against
// their XXH3-64, and scattered into the target boxes (host boxes directly,
// device boxes through leases of the staging pool); then each device gets
// ONE CopyFromHost per wave carrying all of its boxes. Device boxes that do
// not fit in the pool together are restored in waves of at most half of it,
// and a box larger than that in parts along its first axis, so host memory
// stays bounded by the pool.
#ifndef HOIST_CHECKPOINT_RESTORE_RESTORE_H_
#define HOIST_CHECKPOINT_RESTORE_RESTORE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_types.h"
#include "hoist/device.h"
#include "hoist/format/layout.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"
#include "hoist/transfer/staging_pool.h"

namespace hoist {

// Fills every destination of every target from the step at `step_dir`,
// executing PlanRestore's plan (restore_plan.h). Reads only the extents the
// destinations intersect, with up to options.reader_threads threads started
// for the restore and shared by its waves (wave_reader.h), and a thread
// taking the leases of the waves ahead when there are several; all are
// joined before it returns. The calling thread dispatches each wave's copies
// and calls `receiver`.
// `pool` stages device boxes; it must outlive the call.
// Errors: kNotFound for an array the step lacks; kFailedPrecondition when a
// target's dtype or shape differs from the checkpoint's (both in the
// message); kInvalidArgument for a destination outside the array or without
// memory; kDataLoss for an extent whose bytes do not match their XXH3 (naming
// array, extent, file and offset), a truncated file, or a data path that
// leaves the checkpoint through a symlink; kResourceExhausted when one row
// (along the first axis longer than 1) of a device box exceeds half the pool;
// storage and device errors as is. `pool` stages device boxes and must outlive
// the call.
// `receiver` gets the staged parts of destinations that have neither a
// device nor memory (kInvalidArgument if there are such destinations and no
// receiver).
absl::StatusOr<RestoreStats> RestoreCheckpoint(
    Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options = {},
    const RestoreReceiver& receiver = nullptr);

// Opens the data file an extent is in (`place`: PlaceOfExtent of the step
// directory). The overload above opens it in `storage`, below the
// directory; SharedRestore (shared_restore.h) serves some extents from
// memory instead.
using ExtentFileOpener =
    std::function<absl::StatusOr<std::unique_ptr<ReadableFile>>(
        const ExtentPlace& place)>;
// As above, with the step's `manifest` (already read and validated) and
// its files opened by `open`.
absl::StatusOr<RestoreStats> RestoreCheckpoint(
    const Manifest& manifest, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    const ExtentFileOpener& open);

// A restore's phases (RestoreStats::phases, rank 0 until the caller says)
// from when its planning ended, its waves (reading and placing) ended, and
// the time of those spent placing; `verifying`: the reader threads' time
// checking hashes over their number.
struct RestoreTimes {
  absl::Duration planning;
  absl::Duration waves;
  absl::Duration placing;
};
std::vector<PhaseStat> RestorePhases(const RestoreTimes& times,
                                     absl::Duration verifying,
                                     const RestoreStats& stats);
// Adds each of `more` to the phase of its name in `into` (appended, in the
// restore's order, when `into` lacks it).
void AddPhases(absl::Span<const PhaseStat> more, std::vector<PhaseStat>& into);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_RESTORE_H_
