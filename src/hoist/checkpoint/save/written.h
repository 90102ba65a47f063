// What every process of a save wrote, exchanged and agreed on (steps 4 and
// 5 of save.cc's protocol), and the step's manifest built from it.
#ifndef HOIST_CHECKPOINT_SAVE_WRITTEN_H_
#define HOIST_CHECKPOINT_SAVE_WRITTEN_H_

#include <optional>
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

// Which extents BuildManifest puts in a manifest, and how it names their
// data files.
struct ManifestScope {
  // Only that process's extents: what a rank other than 0 keeps as its
  // next save's delta base (default: every process's).
  std::optional<int> process = std::nullopt;
  // The data files are under hashed prefixes (DataFileName), as the
  // ExtentWriter names them on a storage whose capabilities say so.
  bool spread_prefixes = false;
};

// The step's manifest: a referenced slice's extent is the base's (its
// bytes, in the step that wrote them).
Manifest BuildManifest(const SaveRequest& request,
                       const WrittenExtents& written, const DeltaBase* base,
                       const ManifestScope& scope = {});

// `request`'s metadata with "per_rank": every rank's per-rank state
// (SaveRequest::per_rank_json) when they gave some; kInvalidArgument when
// some ranks did and others did not.
absl::StatusOr<std::string> MetadataWithPerRank(
    const SaveRequest& request, const std::vector<std::string>& all);

// The fingerprint of what every process must agree on: the manifest
// without hashes, metadata or step (arrays, shapes, dtypes, shardings,
// every slice's place). O(the plan): a caller that saves one plan again and
// again makes it once (SaveRequest::plan_fingerprint).
uint64_t PlanFingerprint(const SaveRequest& request);

// 6. Rank 0's word on the step: its status (OK: committed), the rank it
// names as failed (-1: none; 0 for rank 0's commit), and the job's slowest
// rank per phase.
struct Verdict {
  absl::Status status;
  int failed_rank = -1;
  std::vector<PhaseStat> slowest;
};

// 4. What rank 0 learns of every rank's save, in one gather to it (no
// other rank receives more than its own, whatever the job's size).
struct Gathered {
  // Rank 0: every rank's extents (hashes, references) and per-rank state;
  // elsewhere empty.
  WrittenExtents all;
  std::vector<std::string> per_rank;
  int64_t received_bytes = 0;  // what this process received
  // Rank 0, before its commit: OK when every rank succeeded and planned
  // rank 0's checkpoint, else kAborted naming the first rank that failed
  // (failed_rank), or kFailedPrecondition naming a rank whose plan
  // differs from rank 0's; and the job's slowest rank per phase this
  // process measured alone (planning to write).
  Verdict verdict;
};

// 4: this process's outcome (`local`), plan fingerprint, per-rank state,
// `phases` and, when it succeeded, its `written` extents, gathered on
// rank 0. Every process sends the same phases, in one order.
absl::StatusOr<Gathered> GatherOutcomes(Coordinator& coordinator,
                                        const SaveRequest& request,
                                        const absl::Status& local,
                                        const WrittenExtents& written,
                                        absl::Span<const PhaseStat> phases);

// 6: rank 0 broadcasts `verdict` (the others' argument is ignored); every
// rank returns the slowest phases when the step committed, else its error:
// a failed rank its own (`local`, its code kept, as "step N aborted: rank
// R: ..."), rank 0 its commit's, the others what rank 0 said.
absl::StatusOr<std::vector<PhaseStat>> ShareVerdict(Coordinator& coordinator,
                                                    const SaveRequest& request,
                                                    const absl::Status& local,
                                                    const Verdict& verdict);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_WRITTEN_H_
