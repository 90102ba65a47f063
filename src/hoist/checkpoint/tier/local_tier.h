// The local tier (CheckpointManagerOptions::local): each process saves its
// part of a step (every box its devices hold) under its own node-local root,
// and copies of the extents of it that too few other processes hold (not a
// data-parallel replica's, which that replica holds itself) to up to
// replicas - 1 peer processes (on other hosts when the job has them).
// Recovery rebuilds a lost part from what the job still holds, the other
// processes' parts and the copies, and restores the newest step every
// process has, or can rebuild, a verified part of.
//
// Layout of one process's local root (every directory a CheckpointRoot,
// with its lock, its recovery and its commit protocol):
//   LOCAL/step_N/               this process's part of step N
//   LOCAL/peers/r00002/step_N/  rank 2's part of step N as kept for it: the
//                               extents sent, their MANIFEST.json, and the
//                               whole part's manifest (PART.json)
//
// Every method that takes part in the job is collective: each rank calls it
// in the same order, from one thread at a time (the manager's saver thread
// for Replicate, the restoring thread for Restore, never both at once).
#ifndef HOIST_CHECKPOINT_TIER_LOCAL_TIER_H_
#define HOIST_CHECKPOINT_TIER_LOCAL_TIER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_root.h"
#include "hoist/checkpoint_types.h"
#include "hoist/coordinator.h"
#include "hoist/storage.h"

namespace hoist {

struct LocalTierOptions;  // checkpoint_manager.h

// The offsets d (1 <= d < processes) a job replicates over: rank p's part
// goes to rank (p + d) % processes for each. `replicas - 1` of them (at most
// processes - 1), preferring, in order, offsets that put every rank's
// replica on another host than the rank (`hosts[p]` names rank p's host).
std::vector<int> ReplicaOffsets(const std::vector<std::string>& hosts,
                                int replicas);

class LocalTier {
 public:
  // Collective. Opens (creating) this process's local root, `root_pattern`
  // with "{rank}" replaced by the rank, and the peer roots it keeps
  // replicas in; learns every rank's host. Errors: kInvalidArgument for
  // replicas < 1 or a root that, for two ranks on one host, is the same
  // directory; storage and lock errors as is (on this rank; every rank
  // fails when one does).
  static absl::StatusOr<std::unique_ptr<LocalTier>> Open(
      const std::string& root_pattern, int replicas, int keep_last,
      Coordinator& coordinator, Storage& storage);

  ~LocalTier();

  const std::string& root() const { return own_->path(); }
  // Where this process's part of each step is committed.
  CheckpointRoot& own() { return *own_; }
  // The ranks that keep this process's replicas, nearest offset first.
  std::vector<int> replica_holders() const;

  // Collective, after this rank's part of `step` committed (`saved` OK) or
  // failed. When every rank's part committed, each sends its replica
  // holders a copy of its part with the extents PlanReplication gives them
  // (replica_plan.h: those fewer than `replicas` processes hold) and its
  // whole manifest, and commits the copies it keeps for others, then
  // prunes both to keep_last; else each removes its part (a step with a
  // missing part is never a local step) and returns kAborted naming the
  // ranks that failed, or `saved` on the rank that failed. OK means this
  // rank's part is committed here and its copies sent; a holder that failed
  // to keep one reports its own error.
  // `sent_bytes`, when given, gets the bytes of extents this rank sent (its
  // manifest, sent too, is not counted).
  absl::Status Replicate(int64_t step, const absl::Status& saved,
                         int64_t* sent_bytes = nullptr);

  // What Restore decided.
  struct Outcome {
    // Set when the local tier served the restore.
    std::optional<RestoreStats> stats;
    int64_t step = 0;      // the step restored, or the durable step to use
    bool durable = false;  // restore `step` from the durable tier
    bool none = false;     // neither tier holds a step to restore
    std::string note;      // what was chosen and why, for logs
    int64_t received_bytes = 0;  // of parts this rank got from peers
  };

  // Collective. Picks the step to restore: `step` if given, else the newest
  // step every rank's part of is here or described by a live peer's copy,
  // unless the durable tier (`durable_steps`, rank 0's list is used) holds
  // one at least as new. Each rank whose part of it is missing gets its
  // extents from the processes that hold them (data-parallel replicas'
  // parts, copies; spread over them), checks their hashes and commits its
  // part again; then every rank restores through `restore` (given the step
  // directory of its part). A part found bad (kDataLoss) is rebuilt, and a
  // copy found bad left out, until no source is left; then the next older
  // step is tried, and when none is left, or a rank's destinations reach
  // outside its part (another sharding: kFailedPrecondition), the outcome
  // is the durable step.
  absl::StatusOr<Outcome> Restore(
      std::optional<int64_t> step, const std::vector<int64_t>& durable_steps,
      const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
          restore);

 private:
  LocalTier(Coordinator& coordinator, Storage& storage,
            std::unique_ptr<CheckpointRoot> own, std::vector<std::string> hosts,
            std::vector<int> offsets, int replicas,
            std::map<int, std::unique_ptr<CheckpointRoot>> kept, int keep_last);

  absl::Status Prune(CheckpointRoot& root);
  // Rank 0's step 2 of Replicate: from every rank's `listed` outcome and
  // extents, each rank's share of the plan, or (when a rank failed) the
  // error every rank returns, as "!" and its message. The error of a part
  // whose extents do not decode (that part then sends nothing).
  absl::Status PlanShares(int64_t step, const std::vector<std::string>& listed,
                          std::vector<std::string>& shares) const;

  Coordinator& coordinator_;
  Storage& storage_;
  const std::unique_ptr<CheckpointRoot> own_;
  const std::vector<std::string> hosts_;  // each rank's
  const std::vector<int> offsets_;
  const int replicas_;
  // The peer roots this process keeps replicas in, by origin rank.
  const std::map<int, std::unique_ptr<CheckpointRoot>> kept_;
  const int keep_last_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TIER_LOCAL_TIER_H_
