// Which bytes of the local tier move between processes (local_tier.h), as
// pure functions every rank evaluates on the same gathered inputs, so that
// all agree without another round trip.
//
// The unit is an extent of a process's part, named by its key: the array,
// its box, its length and the hash of its bytes. Two processes whose parts
// have an extent of one key hold the same bytes (data-parallel replicas do),
// so one of them losing its part loses nothing the job cannot rebuild.
//   - PlanReplication: after a local save, which extents each process sends
//     to which holder, so that every extent is held by `replicas`
//     processes (on that many hosts when the job spans several), the ones
//     already holding it counted. On a data x model job with replicas no
//     more than the data-parallel degree, nothing is sent.
//   - PlanRecovery: for a process whose part is lost, which process serves
//     each of its extents, from its own part or its copy of another's.
#ifndef HOIST_CHECKPOINT_TIER_REPLICA_PLAN_H_
#define HOIST_CHECKPOINT_TIER_REPLICA_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hoist/manifest.h"

namespace hoist {

// One extent of a part: its key (ExtentKey) and its length.
struct PartExtent {
  std::string key;
  int64_t length_bytes = 0;
  friend bool operator==(const PartExtent&, const PartExtent&) = default;
};

// The key of `extent` of `array`: equal keys mean equal bytes.
std::string ExtentKey(const ManifestArray& array, const ManifestExtent& extent);

// Every extent of `manifest`, in its order (arrays, then their extents).
std::vector<PartExtent> PartExtents(const Manifest& manifest);

// Lists of extents as text for Coordinator::AllGather, and back
// (kDataLoss, naming `what`, for text EncodePartExtents did not make).
std::string EncodePartExtents(const std::vector<PartExtent>& extents);
absl::StatusOr<std::vector<PartExtent>> DecodePartExtents(
    absl::string_view text, absl::string_view what);

// What one process sends after a local save: for each offset d it sends
// over (LocalTier's offsets), the indices into its part of the extents it
// sends to rank + d, ascending. Offsets it sends nothing over are absent.
using ReplicationSends = std::map<int, std::vector<int>>;

// `parts[p]`: rank p's part; `hosts[p]`: its host; `offsets`: the offsets
// holders are chosen from, in order of preference (ReplicaOffsets).
// An extent's holders are the ranks whose part has its key; it counts as
// held by as many of them as there are hosts among them when the job spans
// several hosts, else by all. While that count is below `replicas`, one
// holder (of those with the fewest bytes to send so far) sends it to
// holder + d for the next offset d whose rank neither holds it nor, across
// hosts, is on a host already counted. Returns each rank's sends.
std::vector<ReplicationSends> PlanReplication(
    const std::vector<std::vector<PartExtent>>& parts,
    const std::vector<std::string>& hosts, const std::vector<int>& offsets,
    int replicas);

// Where a lost part's extents can come from: rank `rank`'s own part
// (origin == rank) or its copy of rank `origin`'s part.
struct ExtentSource {
  int rank = 0;
  int origin = 0;
  std::vector<PartExtent> extents;
};

// For each lost part (`needs[r]`, empty for a rank that is not lost), the
// index into `sources` serving each of its extents, in its order: a source
// on another rank than r that has the extent's key, the one with the fewest
// bytes to serve so far (own parts before copies, then lower ranks, on a
// tie). kNotFound naming the rank and the first extent no source has.
absl::StatusOr<std::vector<std::vector<int>>> PlanRecovery(
    const std::vector<std::vector<PartExtent>>& needs,
    const std::vector<ExtentSource>& sources);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_REPLICA_PLAN_H_
