// What every process of a save wrote, exchanged and agreed on (steps 4 and
// 5 of save.cc's protocol), and the step's manifest built from it.
#ifndef HOIST_CHECKPOINT_SAVE_WRITTEN_H_
#define HOIST_CHECKPOINT_SAVE_WRITTEN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hoist/checkpoint/save/delta.h"
#include "hoist/checkpoint/save/extent_writer.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/coordinator.h"
#include "hoist/manifest.h"

namespace hoist {

// The step's manifest: a referenced slice's extent is the base's (its
// bytes, in the step that wrote them).
Manifest BuildManifest(const SaveRequest& request,
                       const WrittenExtents& written, const DeltaBase* base);

// `request`'s metadata with "per_rank": every rank's per-rank state
// (SaveRequest::per_rank_json) when they gave some; kInvalidArgument when
// some ranks did and others did not.
absl::StatusOr<std::string> MetadataWithPerRank(
    const SaveRequest& request, const std::vector<std::string>& all);

// 4a. Everyone learns whether everyone succeeded (`local`: this process's
// outcome), and that every process planned the same checkpoint: this
// process's error, or kAborted naming another's, or kFailedPrecondition
// naming a rank whose plan differs from rank 0's.
absl::Status AgreeOnOutcome(Coordinator& coordinator,
                            const SaveRequest& request,
                            const absl::Status& local);

// 4b. Every process's extents (hashes, references) and per-rank state, on
// every process.
// And, per phase this process measured alone (planning to write), the
// job's slowest rank.
struct Gathered {
  WrittenExtents all;
  std::vector<std::string> per_rank;
  std::vector<PhaseStat> slowest;
  int64_t received_bytes = 0;  // what this process received
};

// 4b: `written` and `phases` (this process's) sent to every process, and
// theirs received. Every process sends the same phases, in one order.
absl::StatusOr<Gathered> GatherWritten(Coordinator& coordinator,
                                       const SaveRequest& request,
                                       const WrittenExtents& written,
                                       absl::Span<const PhaseStat> phases);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_WRITTEN_H_
