// The local tier (CheckpointManagerOptions::local): each process saves its
// part of a step (every box its devices hold) under its own node-local root,
// sends that part to replicas - 1 peer processes (on other hosts when the job
// has them), and recovery rebuilds the newest step every process can find a
// verified part of, locally or on a live peer.
//
// Layout of one process's local root (every directory a CheckpointRoot,
// with its lock, its recovery and its commit protocol):
//   LOCAL/step_N/               this process's part of step N
//   LOCAL/peers/r00002/step_N/  rank 2's part of step N, kept for it
//
// Every method that takes part in the job is collective: each rank calls it
// in the same order, from one thread at a time (the manager's saver thread
// for Replicate, the restoring thread for Restore, never both at once).
#ifndef HOIST_CHECKPOINT_LOCAL_TIER_H_
#define HOIST_CHECKPOINT_LOCAL_TIER_H_

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
  // failed. When every rank's part committed, each sends its part to its
  // replica holders and commits the parts it keeps for others, then prunes
  // both to keep_last; else each removes its part (a step with a missing
  // part is never a local step) and returns kAborted naming the ranks that
  // failed, or `saved` on the rank that failed. OK means this rank's part
  // is committed here and sent; a holder that failed to keep it reports
  // its own error.
  // `sent_bytes`, when given, gets the bytes this rank sent.
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
  // step that every rank's part of is here or on a live peer, unless the
  // durable tier (`durable_steps`, rank 0's list is used) holds a newer one.
  // For a local step, each rank whose part is missing here gets it from a
  // peer, then every rank restores through `restore` (given the step
  // directory of its part); a part that fails (corrupt: kDataLoss, or
  // missing) is fetched from the next peer keeping it; when a rank has no
  // source left, or its destinations reach outside its part (another
  // sharding: kFailedPrecondition), the outcome is the durable step.
  absl::StatusOr<Outcome> Restore(
      std::optional<int64_t> step, const std::vector<int64_t>& durable_steps,
      const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
          restore);

 private:
  LocalTier(Coordinator& coordinator, Storage& storage,
            std::unique_ptr<CheckpointRoot> own, std::vector<int> offsets,
            std::map<int, std::unique_ptr<CheckpointRoot>> kept, int keep_last);

  // Collective shift by `offset`: this rank sends the step directory
  // `send_dir` (empty: nothing) to rank + offset, and commits what rank -
  // offset sends (if anything) as `step` of `into` (replacing it there).
  // Adds the bytes it sent to `sent` and those it received to `received`
  // when given.
  absl::Status Shift(const std::string& name, int64_t step, int offset,
                     const std::string& send_dir, CheckpointRoot* into,
                     int64_t* sent = nullptr, int64_t* received = nullptr);
  absl::Status Prune(CheckpointRoot& root);

  Coordinator& coordinator_;
  Storage& storage_;
  const std::unique_ptr<CheckpointRoot> own_;
  const std::vector<int> offsets_;
  // The peer roots this process keeps replicas in, by origin rank.
  const std::map<int, std::unique_ptr<CheckpointRoot>> kept_;
  const int keep_last_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_LOCAL_TIER_H_
