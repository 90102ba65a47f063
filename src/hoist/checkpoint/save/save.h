// Saving one checkpoint step: stage, persist and commit (see save.cc for the
// protocol). The CheckpointManager runs this in the background; tests and
// benchmarks call it directly.
#ifndef HOIST_CHECKPOINT_SAVE_SAVE_H_
#define HOIST_CHECKPOINT_SAVE_SAVE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_types.h"
#include "hoist/coordinator.h"
#include "hoist/format/manifest_index.h"
#include "hoist/manifest.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/storage.h"
#include "hoist/trace.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

struct SaveRequest {
  std::string root;  // the checkpoint root directory; must exist
  int64_t step = 0;  // >= 0
  absl::Span<const ArraySpec> arrays;  // what `plan` was made from
  const SavePlan* plan = nullptr;
  // PlanFingerprint(*this), when the caller keeps it from an earlier save
  // of the same plan (0: made here, when the job has several processes).
  uint64_t plan_fingerprint = 0;
  std::string metadata_json = "{}";  // a JSON object, stored in the manifest
  bool overwrite = false;  // replace a committed step of the same number
  // Called on the saving thread when every copy is enqueued, and when every
  // slice is in host memory (from then on the device arrays may change), with
  // the staging status. Each runs exactly once, also when the save fails
  // before staging. Optional.
  std::function<void(const absl::Status&)> on_dispatched;
  std::function<void(const absl::Status&)> on_staged;
  // Records the commit phases and every write when set. Optional.
  Tracer* tracer = nullptr;
  // Counts bytes staged and written when set. Optional.
  SaveProgress* progress = nullptr;
  // Runs first on each writer thread (the manager lowers their priority
  // with it). Optional.
  std::function<void()> writer_thread_setup;
  // Set when the plan is one process's part (SavePlanOptions::
  // part_of_process), saved alone: the manifest says so (manifest.h).
  std::optional<ManifestPart> part;
  // This process's share of `plan` laid out by the engine SaveCheckpoint is
  // given (TransferEngine::Lay), kept by a caller that saves the same plan
  // again; staging lays it out itself when null. Optional.
  std::shared_ptr<const StagingLayout> layout;
  // Deltas (docs/delta.md): an extent whose bytes equal those of the same
  // array's extent in the newest committed step (other than this one)
  // references them instead of being written. Never for a part.
  bool deltas = true;
  // How the committed manifest is encoded (split above how many extents).
  ManifestEncoding manifest_encoding;
  // Frozen arrays (CheckpointManagerOptions::frozen): per plan slice, 1
  // for a frozen array's. With `frozen_skipped`, those slices were not
  // staged (the layout leaves them out): each is referenced in the base,
  // which must be step `frozen_base` (else kAborted: save again). Without,
  // each staged one whose base extent differs fails the save
  // (kFailedPrecondition naming the array): a frozen array changed.
  std::shared_ptr<const std::vector<uint8_t>> frozen;
  bool frozen_skipped = false;
  int64_t frozen_base = -1;
  // This process's per-rank state (SaveOptions::per_rank_json): gathered
  // with the hashes; rank 0 adds "per_rank": [every rank's] to the
  // metadata. Empty on every rank, or on none.
  std::string per_rank_json;
  // The manifest of the step the caller believes is the newest committed
  // (the last save's SaveResult::manifest): spares reading the base's
  // manifest, and indexing it, when it is. Optional.
  std::shared_ptr<const IndexedManifest> base_hint;
  // The phases this process measured before the save was handed here (the
  // manager's planning and queued), and when its copies began (default:
  // when SaveCheckpoint was called). They lead SaveResult::phases and are
  // gathered with the hashes for SaveResult::slowest.
  std::vector<PhaseStat> phases_before;
  absl::Time staging_began = absl::InfinitePast();
  // With `layout`: the sources of arrays that have not moved since the
  // last save given it, and the copies prepared from them
  // (TransferEngine::Begin). Optional.
  std::shared_ptr<StableSources> stable;
  // Makes the shards whose source is ProducedSource() (TransferEngine::
  // Begin). Optional.
  std::shared_ptr<ShardProducer> producer;
  // The save fails unless it can commit by then (a preemption save's
  // deadline): a rank past it when its writes end fails the step on every
  // rank (kDeadlineExceeded), and rank 0 does not commit past it.
  absl::Time deadline = absl::InfiniteFuture();
};

struct SaveResult {
  std::string path;  // the committed step directory
  TransferStats transfer;
  int64_t bytes = 0;  // array bytes saved by this process
  // Of `bytes`, those not written: the newest committed step's (deltas).
  int64_t referenced_bytes = 0;
  // The committed manifest (on every rank), indexed: the next save's base.
  std::shared_ptr<const IndexedManifest> manifest;
  absl::Duration staged;     // until every slice was in host memory
  absl::Duration committed;  // until the step was durable and visible
  // SaveRequest::phases_before, then staging, write (upload where the
  // storage is not local), hash and commit, this process's; and the job's
  // slowest rank in each phase up to write (SaveInfo has the same).
  std::vector<PhaseStat> phases;
  std::vector<PhaseStat> slowest;
};

// Holds staged extents until the writer exists (the first wave's copies
// are dispatched before the save's directory and files are made), then
// hands them, and every later one, to it; or, attached to nothing, drops
// them (their leases return to the pool).
class DeferredSink final : public StagedExtentSink {
 public:
  // Adds the bytes of every extent it has received, and of every later one
  // as it arrives, to `progress`'s staged_bytes (null: none): they are
  // counted staged when they are, whether or not the writer is attached.
  void CountInto(SaveProgress* progress) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    progress_ = progress;
    if (progress_ == nullptr) return;
    int64_t bytes = 0;
    for (const StagedExtent& extent : held_) {
      bytes += extent.lease.size_bytes();
    }
    progress_->staged_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }

  void OnStaged(StagedExtent extent) override ABSL_LOCKS_EXCLUDED(mu_) {
    StagedExtentSink* target;
    {
      MutexLock lock(&mu_);
      if (progress_ != nullptr) {
        progress_->staged_bytes.fetch_add(extent.lease.size_bytes(),
                                          std::memory_order_relaxed);
      }
      target = target_;
      if (target == nullptr) {
        if (!dropping_) held_.push_back(std::move(extent));
        return;
      }
    }
    target->OnStaged(std::move(extent));
  }

  // Once: `target` (null: drop them) receives the extents held so far and
  // every later one.
  void Attach(StagedExtentSink* target) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<StagedExtent> held;
    {
      MutexLock lock(&mu_);
      target_ = target;
      dropping_ = target == nullptr;
      held.swap(held_);
    }
    if (target == nullptr) return;  // `held` goes, and its leases with it
    for (StagedExtent& extent : held) target->OnStaged(std::move(extent));
  }

 private:
  Mutex mu_;
  StagedExtentSink* target_ ABSL_GUARDED_BY(mu_) = nullptr;
  SaveProgress* progress_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool dropping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<StagedExtent> held_ ABSL_GUARDED_BY(mu_);
};

// Steps 5 and 6 of the protocol (save.cc) for a step directory `tmp` under
// `root` whose data files are written: the storage's commit writes the
// manifest `manifest_json` last (Storage::CommitDir) and makes `tmp` step
// `step`. With `overwrite`, a committed step of that number is moved aside
// and removed once the new one is durable (a crash between leaves it for
// CheckpointRoot's recovery to bring back). kAlreadyExists when the step
// exists and `overwrite` is off; on any error what is visible is the old
// state. The local tier commits the parts it receives this way too.
absl::Status CommitStep(Storage& storage, const std::string& root, int64_t step,
                        const std::string& tmp, std::string_view manifest_json,
                        bool overwrite);

// A save whose first wave of copies was dispatched ahead (BeginSave), on
// another thread than SaveCheckpoint's: the CheckpointManager dispatches on
// the caller's thread, so that a save in dispatched mode returns without
// waiting for its saver thread to be scheduled.
struct BegunSave {
  // Finishes (waits for) a run SaveCheckpoint never took, dropping its
  // extents.
  ~BegunSave();
  // Every copy is enqueued (the share fit in one wave); false once
  // SaveCheckpoint took the run.
  bool all_dispatched() const;

  DeferredSink sink;  // before `run`, whose copies deliver into it
  TransferEngine* engine = nullptr;
  std::unique_ptr<StagingRun> run;  // null once SaveCheckpoint took it
};

// Begins staging a process's share of `plan`, laid out by `engine`
// (TransferEngine::Lay, on `devices`), for SaveCheckpoint to finish; `plan`
// and the arrays `sources` points to must outlive that. `stable`: as
// SaveRequest's.
// Errors: Begin's (nothing was dispatched; SaveCheckpoint without a begun
// save reports them).
absl::StatusOr<std::unique_ptr<BegunSave>> BeginSave(
    const SavePlan& plan, std::shared_ptr<const StagingLayout> layout,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources,
    std::shared_ptr<StableSources> stable = nullptr,
    std::shared_ptr<ShardProducer> producer = nullptr);

// Saves this process's share of `request.plan` and, together with the other
// ranks of `coordinator`, commits the step. On error nothing is visible under
// the step's name (a partial save leaves at most a .tmp directory, removed
// here when possible and by garbage collection otherwise), and the previously
// committed steps are untouched.
// Errors: kAlreadyExists if the step is committed and overwrite is false;
// kInvalidArgument for a bad request (metadata that EncodeManifest refuses
// is found at commit; the CheckpointManager refuses it before it accepts
// the step); staging and storage errors as is.
// `begun`, when given, is this request's BeginSave: staging goes on from
// its first wave (on_dispatched runs at once when it was the only one).
absl::StatusOr<SaveResult> SaveCheckpoint(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources, std::unique_ptr<BegunSave> begun = nullptr);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_SAVE_H_
