// Restoring a step once per job, not once per replica: when several
// processes need the same saved extent (data-parallel replicas restoring
// the same boxes), one of them reads it from storage and sends it to the
// others through Coordinator::Exchange.
#ifndef HOIST_CHECKPOINT_RESTORE_SHARED_RESTORE_H_
#define HOIST_CHECKPOINT_RESTORE_SHARED_RESTORE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/checkpoint_types.h"
#include "hoist/coordinator.h"
#include "hoist/storage.h"
#include "hoist/transfer/staging_pool.h"

namespace hoist {

// RestoreCheckpoint (restore.h), collectively: every rank of `coordinator`
// calls it for the same step, each with its own targets. The ranks learn
// which saved extents each needs; an extent needed by one rank is read by
// it, as RestoreCheckpoint reads; one needed by several is read by one of
// them (the one with the fewest such bytes to read so far), verified, and
// sent to the others, whose restore takes it from memory (and checks its
// hash again). This goes in rounds of whole arrays, in manifest order, each
// holding in memory of its own at most half the size of `pool` of such
// extents on any rank (an array that alone holds more is a round of its
// own, in memory of its size), freed when the round ends.
//
// RestoreStats::bytes_read is the bytes of extents this rank read from
// storage (as RestoreCheckpoint counts them: not the alignment gaps between
// extents read together); bytes_received what it received from other ranks.
// Errors: as RestoreCheckpoint's, on the rank whose targets or reads fail (an
// extent its reader could not read reaches the others as bytes that fail their
// hash: kDataLoss there too); the coordinator's (a lost rank) on all.
//
// `share_on_one_host`: whether to share when every rank is on one host (the
// ranks learn each other's host names with what they need; the manager
// shares there when asked to, or when the storage is not local: reads from
// an object store cost a request each); when not, they all restore alone
// there, as RestoreCheckpoint does.
absl::StatusOr<RestoreStats> SharedRestore(
    Coordinator& coordinator, Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    bool share_on_one_host);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_SHARED_RESTORE_H_
