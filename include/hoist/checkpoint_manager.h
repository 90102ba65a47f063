// CheckpointManager: the API a training loop uses. It owns a root directory
// (exclusively, through a lock file), a staging pool allocated once, and one
// background saver thread. Save() returns as soon as the arrays are staged
// (or only dispatched, in overlapped mode); writing, hashing, committing and
// pruning old steps continue on the saver thread.
//
// Thread-safety: Save, WaitUntilFinished and Restore may be called from one
// thread at a time; List, Latest, Verify and Delete from any thread.
#ifndef HOIST_CHECKPOINT_MANAGER_H_
#define HOIST_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/checkpoint_types.h"
#include "hoist/coordinator.h"
#include "hoist/device.h"
#include "hoist/future.h"
#include "hoist/manifest.h"
#include "hoist/save_plan.h"
#include "hoist/shard_producer.h"
#include "hoist/storage.h"
#include "hoist/trace.h"

namespace hoist {

// The local tier: frequent saves to each process's own fast storage
// (node-local disk, /dev/shm), each process's part copied to peers, so that
// a restart reads local bytes and losing a node loses nothing; the durable
// root takes only every persist_every-th step. See docs/tiers.md.
struct LocalTierOptions {
  // This process's local root; "{rank}" is replaced by its rank (two ranks
  // on one host must not share a root). Empty (default): no local tier.
  std::string root;
  // Steps divisible by this (default 1) that are not durable steps are
  // saved to the local tier; other steps are skipped (SaveInfo::skipped).
  int64_t every = 1;
  // Holders of each box of a local step (default 2), on as many hosts when
  // the job spans several: processes whose own parts hold it (data-parallel
  // replicas) count, and copies go to up to replicas - 1 other processes,
  // on other hosts first, for the boxes too few hold. At most the job's
  // process count; 1 keeps no copy.
  int replicas = 2;
  // Local steps kept (default 2), and as many of each peer's parts.
  int keep_last = 2;
  // Data files of each part (default 0: the durable saves' number when
  // CheckpointManagerOptions::plan.writer_streams gives one, else the
  // local filesystem's choice, 2).
  int writer_streams = 0;
};

// Preemption (docs/robustness.md): a signal announces it, the ranks agree
// on a step (CheckpointManager::ReachedPreemption), and the save of that
// step goes where it commits fastest, within a deadline.
struct PreemptionOptions {
  // Signals that announce a preemption (SIGTERM, as Slurm and Kubernetes
  // send it before they kill a job). Their handler only counts the signal
  // and calls the handler the job installed before the manager opened;
  // it no longer ends the process, so the training loop must ask
  // ReachedPreemption and exit after the save. Empty (default): no
  // preemption handling.
  std::vector<int> signals;
  // The preemption save fails unless it commits within this, counted from
  // when this rank learned of the preemption (default 30 s: Slurm's
  // KillWait and torchrun's grace before SIGKILL are 30 s); also how long
  // ranks wait for each other to agree on the step.
  absl::Duration deadline = absl::Seconds(30);
  // How often each rank looks for the signal and at the other ranks'
  // notices (default 1 s: one read of the coordinator's notice board,
  // e.g. one request to torch's TCPStore, per rank per second).
  absl::Duration poll = absl::Seconds(1);
};

struct CheckpointManagerOptions {
  // Pinned staging pool, allocated once (default 1 GiB). Saves larger
  // than this stage in waves; no slice may exceed it.
  int64_t pool_bytes = int64_t{1} << 30;
  // Bounds what a save holds in host memory: the pool, plus the overflow
  // where the waves of a save larger than the pool are staged (host memory
  // from Backend::AllocateOverflow: pageable on the host backend, pinned
  // for CUDA), so that the caller waits for the copies, not for storage.
  // The overflow is allocated by the first save that needs it, grown when
  // a later one needs more, and kept (faulted in) for the saves after it.
  // A save that does not fit stages what does not fit as the writes free
  // the pool, waiting for storage, and says so (SaveInfo::blocked_reason).
  // > 0: bytes, at least pool_bytes (else kInvalidArgument). 0 (default):
  // auto, half the memory available when the manager opens (MemAvailable)
  // split evenly among the job's processes on this host, at least
  // pool_bytes: a state that fits in memory twice over is staged at the
  // copies' speed, and the host keeps half its free memory.
  int64_t host_memory_budget = 0;
  // When the pool is pinned (faulting in every page: about 0.4 s per GiB on
  // a small VM, and it holds the process's mmap lock meanwhile).
  enum class PoolPinning {
    // Default. When the root holds no committed step (a new job: nothing
    // to restore), Open pins the pool before it returns, as kAtOpen. Else
    // a thread of the manager pins it in the background, starting at the
    // first save or restore onto devices, or PinPool(), whichever comes
    // first (a restore into host memory needs no pool: see
    // RestoreOptions::pin_pool_after). A save or restore that needs the
    // pool waits for it; an allocation error is its error.
    kBackground,
    // Open pins the pool before it returns and reports its errors.
    kAtOpen,
  };
  PoolPinning pool_pinning = PoolPinning::kBackground;
  // The scheduling priority of the manager's background threads (the
  // writer threads, which write and hash; the pool's pinner), so that a
  // training loop's threads take the cores first. The saver thread (which
  // dispatches the device copies, on the training loop's clock) and the
  // host backend's copy engines (staging) keep the process's priority,
  // under SCHED_BATCH (their wake-ups never preempt the training loop).
  enum class BackgroundPriority {
    kNormal,  // the process's own
    kLow,     // default: nice + 10
    kIdle,    // SCHED_IDLE: only cycles no other thread wants
  };
  BackgroundPriority background_priority = BackgroundPriority::kLow;
  // How data files are written and read on the local filesystem (default
  // plain syscalls).
  IoEngine io = IoEngine::kPosix;
  // A root on an object store (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX):
  // what overrides the environment's configuration (see storage.h and
  // docs/object-storage.md; default: the environment's).
  ObjectStoreOptions object_store;
  // The two above as the one value OpenStorage takes (`object_store` for
  // either kind of object store).
  StorageOptions storage() const {
    return {.io = io, .s3 = object_store, .gcs = object_store};
  }
  // Replica rule, min slice, writer streams per process, ... Writer
  // streams 0 (the default here) leaves their number to the root's storage
  // (Storage::preferred_writer_streams: 2 on a local filesystem, 4 on S3,
  // 16 on GCS); see LocalTierOptions::writer_streams for the local tier.
  SavePlanOptions plan = [] {
    SavePlanOptions o;
    o.writer_streams = 0;
    return o;
  }();
  // Keep the newest N committed steps (default 0: keep every step), plus
  // every step divisible by keep_every (default 0: none). Older steps are
  // deleted only after a newer one has committed.
  int keep_last = 0;
  int64_t keep_every = 0;
  // Saves accepted but not yet committed at once (default 1: a Save first
  // waits for the previous one to commit).
  int max_in_flight = 1;
  // What Save does when max_in_flight saves are already in flight (storage
  // slower than the saves, or stuck).
  enum class WhenBusy {
    kWait,  // default: wait for the oldest to commit; the caller waits
    // Return at once with a skipped handle (nothing staged or written; see
    // SaveHandle::skipped) and count it (durability()); the caller goes on.
    // One process only: in a job of several, every rank would have to make
    // the same choice, so Open refuses it with kInvalidArgument.
    kSkip,
  };
  WhenBusy when_busy = WhenBusy::kWait;
  // Only steps divisible by this are saved to the durable root (default 1:
  // every step). With a local tier the others go there (LocalTierOptions).
  int64_t persist_every = 1;
  LocalTierOptions local;
  RestoreOptions restore;
  // Deltas (docs/delta.md, default on): a durable save writes only the
  // extents whose bytes changed since the newest committed step, and
  // references the others' bytes there. SaveOptions::deltas overrides it
  // per save. The local tier's parts are always whole.
  bool deltas = true;
  // A step's manifest is written split (format hoist/3: a head, then each
  // array's extents in a section that a reader reads only when it needs
  // the array) above this many extents (default kSplitManifestExtents,
  // 65,536; 0: always). See ManifestEncoding and docs/format.md.
  int64_t split_manifest_above_extents = kSplitManifestExtents;
  // Frozen arrays (with deltas): true for the name of an array that never
  // changes (a fine-tune's frozen base, frozen embeddings). A durable save
  // copies, hashes and writes a frozen array only when the newest step
  // this manager committed lacks it (the first save); later saves neither
  // copy nor hash it, so blocked time drops with it: they reference its
  // bytes. Every frozen_check_every-th of those saves (default 0: never)
  // copies and hashes the frozen arrays anyway and fails with
  // kFailedPrecondition, naming the array, when one changed (a frozen
  // array that changes is the caller's error). Default: none is frozen.
  std::function<bool(std::string_view name)> frozen;
  int frozen_check_every = 0;
  // When set, every save records its device copies ("device N" tracks), its
  // writes ("writer FILE") and its commit phases ("commit"). It must outlive
  // the manager. Default none. Each save's and restore's phases go on its
  // "phases" track.
  Tracer* tracer = nullptr;
  // When set, each save and restore appends one JSON line per phase of this
  // rank to this file (docs/observability.md has the fields), on the saver's
  // thread after the save. "{rank}" in it becomes the rank; without it every
  // rank appends to one file (each record is one write). Open fails when it
  // cannot be opened for appending. Default none.
  std::string metrics_path;
  // A save whose bytes have not moved for this long logs a warning naming
  // the phase, the rank and the file or object, once per stall; it goes on
  // running (timeouts still fail it). So does a restore that has read no
  // bytes for this long, naming the file or object it reads. 0: never.
  // Default 60 s.
  absl::Duration stall_warn = absl::Seconds(60);
  // Where warnings go (a stalled save or restore), called on a background
  // thread.
  // Default: a line on stderr.
  std::function<void(const std::string&)> on_warning;
  // Called with each save's and restore's phases once they are known (the
  // metrics file has them by then): on the saver's thread for a save, the
  // caller's for a restore. Keep it short. Default none.
  std::function<void(const PhaseReport&)> on_phases;
  // Saves before a preemption (see PreemptionOptions).
  PreemptionOptions preemption;
};

// The host memory budget in bytes that CheckpointManager::Open resolves
// from `options` (host_memory_budget, pool_bytes) for this process of the
// job: for a caller that plans around it (`hoist demo`'s prediction).
// Collective when the budget is auto (every rank calls it). Errors: Open's
// for these options (kInvalidArgument), the coordinator's.
absl::StatusOr<int64_t> ResolveHostMemoryBudget(
    const CheckpointManagerOptions& options, Coordinator& coordinator);

// What one save may do differently from the manager's options.
struct SaveOptions {
  // Deltas for this save (unset: CheckpointManagerOptions::deltas).
  std::optional<bool> deltas;
  // State that differs per process (RNG states, a data loader's position),
  // as a JSON value, small (at most kMaxPerRankJsonBytes). When given (on
  // every rank of the save, or on none), the step's metadata gains
  // "per_rank": [rank 0's value, rank 1's, ...], gathered by the saver
  // with the extents' hashes (no collective on the caller's thread).
  std::string per_rank_json;
  // Produces the shards marked SaveArray::Shard::produced, wave by wave
  // (shard_producer.h); required when any is. Held until the save's staging
  // ends (SaveHandle::WaitStaged). Default none.
  std::shared_ptr<ShardProducer> producer;
};
inline constexpr int64_t kMaxPerRankJsonBytes = int64_t{16} << 20;

// One array to save: its spec, and where each local device holds its shard
// (the shard's bytes, dense, row-major, in that device's memory). `data` is
// null only for an array with no elements (PyTorch's empty tensors have no
// storage), or for a shard marked `produced`: SaveOptions::producer puts
// that one in host memory when staging reaches it (not for Register). Any
// other null shard is kInvalidArgument.
struct SaveArray {
  ArraySpec spec;
  struct Shard {
    DeviceId device;
    const void* data;
    bool produced = false;
  };
  std::vector<Shard> shards;
};

// Arrays registered with a manager (CheckpointManager::Register), to be
// saved again and again from where they are. Copyable; every copy names
// the same registration. It may outlive its manager, but is saved only
// through it.
class RegisteredArrays {
 public:
  RegisteredArrays() = default;  // none: Save refuses it
  class State;

 private:
  friend class CheckpointManager;
  explicit RegisteredArrays(std::shared_ptr<State> state)
      : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// When Save returns.
enum class ReturnWhen {
  // Once every byte is in host memory: the caller may change the arrays.
  kStaged,
  // Once every copy is enqueued: staging overlaps the caller's next work,
  // which must WaitStaged() before it changes the arrays.
  kDispatched,
};

// What a committed save did.
struct SaveInfo {
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;  // array bytes this process saved
  // Of `bytes`, those not written: the same as the newest committed step's,
  // referenced there (deltas).
  int64_t referenced_bytes = 0;
  int64_t dispatches = 0;  // device-to-host dispatches
  int64_t waves = 0;
  absl::Duration dispatched;  // from Save() until every copy was enqueued
  absl::Duration staged;      // ... until every byte was in host memory
  absl::Duration committed;   // ... until the step was durable and visible
  // Not saved (every figure zero): WhenBusy::kSkip, or a step that is
  // neither a durable nor a local step (persist_every, local.every).
  bool skipped = false;
  Tier tier = Tier::kDurable;  // where it was saved
  // A local step: the bytes of extents this process sent its replica
  // holders: those of its part that fewer than `local.replicas` processes
  // hold (0 where data-parallel replicas hold every box that often).
  int64_t replicated_bytes = 0;
  // Of `bytes`, those staged into the pool's overflow (host memory beside
  // the pool: CheckpointManagerOptions::host_memory_budget), and those
  // that waited for storage to free memory first because neither had room.
  int64_t overflow_bytes = 0;
  int64_t stalled_bytes = 0;
  // Why Save() waited for more than the copies ("" when it did not): the
  // bytes that waited for storage and the setting to raise.
  std::string blocked_reason;
  // This rank's phases, in order (docs/observability.md): planning, queued
  // (behind an earlier save), staging, write (upload on an object store),
  // hash (every rank's extent hashes exchanged), commit, retention; a local
  // step's: replicate after commit, no retention. They add up to `elapsed`.
  std::vector<PhaseStat> phases;
  // From Save() until the save's last phase ended (retention included).
  absl::Duration elapsed;
  // The job's slowest rank in each phase up to write, learned with the
  // extent hashes (no collective of its own): the phases where ranks work
  // alone. Later phases wait for every rank, so take as long on each.
  std::vector<PhaseStat> slowest;
};

// How far the committed steps trail the saves asked for.
struct Durability {
  int64_t skipped_saves = 0;                   // by WhenBusy::kSkip, since Open
  std::optional<int64_t> last_committed_step;  // by this manager
  absl::Time last_committed;                   // when (InfinitePast before one)
  int64_t in_flight = 0;  // saves accepted, not yet committed or failed
};

// A save's copy fences, one per local device that has them (CUDA).
using CopyFences = std::vector<std::shared_ptr<const CopyFence>>;

// One save in flight. Copyable; every copy sees the same save.
class SaveHandle {
 public:
  int64_t step() const { return step_; }
  // True when the save was skipped (WhenBusy::kSkip): every wait returns at
  // once, OK, and WaitCommitted's SaveInfo says skipped.
  bool skipped() const { return skipped_; }
  // Where the step goes (the preemption save's tier too); kDurable for a
  // skipped save.
  Tier tier() const { return tier_; }
  // Each waits for its stage and returns its status (the save's error if it
  // failed there or earlier).
  absl::Status WaitDispatched() const { return dispatched_.Wait().status(); }
  absl::Status WaitStaged() const { return staged_.Wait(); }
  absl::StatusOr<SaveInfo> WaitCommitted() const { return committed_.Wait(); }
  // True once committed or failed; false when `timeout` passed first.
  [[nodiscard]] bool WaitCommittedFor(absl::Duration timeout) const {
    return committed_.WaitFor(timeout);
  }
  // Without blocking: OK once committed, kUnavailable while in flight, or
  // the error that failed the save.
  absl::Status status() const;

  // Bytes staged and written so far, of total_bytes (for progress bars).
  const SaveProgress& progress() const { return *progress_; }

  // Orders `stream` after this save's device-to-host copies, on the device,
  // instead of blocking the CPU until they finish: for the CUDA backend,
  // waits for WaitDispatched() (every copy enqueued; its error is returned),
  // then makes `stream` (a cudaStream_t, e.g. the training's compute stream;
  // nullptr: the legacy default stream) wait on each local device's fence
  // (a cudaEvent_t recorded after the save's last copy on that device) and
  // returns: kernels queued on `stream` afterwards run once the copies have
  // read the arrays. A copy that fails still fails the save (WaitStaged,
  // WaitCommitted). Backends whose devices have no such queue (host), and a
  // device that failed to make its fence: WaitStaged(), the CPU waiting.
  absl::Status WaitStagedOn(void* stream) const;

  // The fences WaitStagedOn waits on (one per local device that has one;
  // none for the host backend or when a device failed to make one: then
  // wait with WaitStaged()), once WaitDispatched() is OK: for callers
  // that make their own streams wait (cudaStreamWaitEvent on each fence's
  // native_handle()). They stay valid as long as any copy of this handle.
  absl::StatusOr<CopyFences> StagedFences() const { return dispatched_.Wait(); }

 private:
  friend class CheckpointManager;
  SaveHandle(int64_t step, Future<CopyFences> dispatched, Future<> staged,
             Future<SaveInfo> committed,
             std::shared_ptr<const SaveProgress> progress, bool skipped = false,
             Tier tier = Tier::kDurable)
      : step_(step),
        skipped_(skipped),
        tier_(tier),
        dispatched_(std::move(dispatched)),
        staged_(std::move(staged)),
        committed_(std::move(committed)),
        progress_(std::move(progress)) {}
  int64_t step_ = 0;
  bool skipped_ = false;
  Tier tier_ = Tier::kDurable;
  Future<CopyFences> dispatched_;
  Future<> staged_;
  Future<SaveInfo> committed_;
  std::shared_ptr<const SaveProgress> progress_;
};

class CheckpointManager {
 public:
  // Opens (creating if needed) `root`, a local path or an object store's URL
  // (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX), as CheckpointRoot::Open does
  // (rank 0
  // takes its lock and recovers what a crashed process left; the other ranks
  // check that they see that lock), allocates the pool (in the background:
  // see pin_pool_in_background) and starts the saver thread. `backend` drives
  // this process's devices and `coordinator` links the job's processes; both
  // must outlive the manager. `storage` overrides the I/O engine (tests); it
  // must outlive the manager. Errors: kFailedPrecondition when another manager
  // holds the root; kInvalidArgument for bad options; storage and pool errors
  // as is.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Open(
      const std::string& root, Backend& backend, Coordinator& coordinator,
      const CheckpointManagerOptions& options = {}, Storage* storage = nullptr);

  // Waits for every save in flight, then releases the root.
  ~CheckpointManager();

  // Saves `arrays` as `step`, returning per `return_when`. The shards'
  // memory must stay valid and unchanged until WaitStaged(). Errors found
  // before anything starts (a bad plan, an existing step, an earlier save's
  // background error not yet reported) are returned here; later ones on the
  // handle, and again from the next call. A save is reported staged when
  // its last copy lands, whether or not its step directory is made and its
  // delta base found by then: an error there may come on the handle.
  // kInvalidArgument, before the step is accepted, for a negative step or
  // `metadata_json` that ValidateMetadataJson (manifest.h) refuses: not a JSON
  // object, not UTF-8, NaN or infinities, nested deeper than kMaxJsonDepth.
  // With WhenBusy::kSkip and max_in_flight saves in flight, returns at once a
  // skipped handle (after the checks above) and the arrays are not read.
  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  absl::Span<const SaveArray> arrays,
                                  std::string metadata_json = "{}",
                                  ReturnWhen return_when = ReturnWhen::kStaged,
                                  const SaveOptions& options = {});

  // Registers `arrays`, whose shards stay where they are from save to
  // save (PyTorch updates parameters and optimizer state in place), for
  // Save(step, registered): their specs are planned and their shards
  // looked up once, here, and each of those saves reads none of them and
  // dispatches the copies it prepared the first time (one dispatch per
  // device, at a cost that does not grow with the arrays). The shards
  // must stay valid, at these addresses, for every save of the
  // registration, and unchanged during each as Save says. Arrays that
  // move (JAX makes new buffers every step) are saved with Save(step,
  // arrays). Errors, before anything is registered: kInvalidArgument for
  // a shard with no data or not on this process's devices; the plan's;
  // kResourceExhausted for a slice larger than the pool.
  absl::StatusOr<RegisteredArrays> Register(absl::Span<const SaveArray> arrays);

  // Save(step, arrays, ...) of registered arrays as they are now.
  // kInvalidArgument for an empty registration or another manager's.
  absl::StatusOr<SaveHandle> Save(int64_t step,
                                  const RegisteredArrays& registered,
                                  std::string metadata_json = "{}",
                                  ReturnWhen return_when = ReturnWhen::kStaged,
                                  const SaveOptions& options = {});

  // Whether the job is to save `step` and stop because it is being
  // preempted: true on every rank at the same step, the first that every
  // rank reaches after any rank received one of PreemptionOptions::signals
  // (or NotePreemption), and at every later step; always false without
  // preemption signals. Call it with each step of the training loop, steps
  // never decreasing. Before any notice it takes a mutex and nothing else
  // (the ranks agree on a background thread); after one, a new step waits
  // until every rank has said its last step. Then Save(step, ...) of that
  // step is the preemption save: to the local tier when there is one,
  // else to the durable root, without retention, failing on every rank
  // with kDeadlineExceeded when it cannot commit within
  // PreemptionOptions::deadline (no partial step is ever visible).
  // Errors: kInvalidArgument for a negative step; kDeadlineExceeded naming
  // how many ranks said theirs when the others did not within the
  // deadline; the coordinator's notice board's.
  absl::StatusOr<bool> ReachedPreemption(int64_t step);
  // This rank learned of a preemption by other means (a scheduler's API, a
  // cloud's metadata server): as if it had received a signal. Any thread.
  // kFailedPrecondition without PreemptionOptions::signals.
  absl::Status NotePreemption();

  // Waits until every accepted save has committed or failed; returns the
  // first background error not yet reported.
  absl::Status WaitUntilFinished();

  // How far the committed steps trail the saves (skipped saves, the last
  // committed step and when). Any thread.
  Durability durability() const;

  // The resolved CheckpointManagerOptions::host_memory_budget, in bytes.
  int64_t host_memory_budget() const;

  // Starts pinning the pool in the background if it is still to pin
  // (PoolPinning::kBackground) and nothing has started it; else nothing.
  // For a caller that wants its first save after a restore to find the
  // pool ready, once its own work after the restore is done (see
  // RestoreOptions::pin_pool_after). Any thread.
  void PinPool();

  // What a Restore(step, ...) would restore, decided before any array is
  // read, for a caller that makes its targets from the manifest (Python's
  // restore): the step (with `step` unset, the newest across the tiers),
  // the tier it comes from, and its manifest (from the local tier, this
  // process's part's: every array, with only its own boxes' extents).
  // Collective with a local tier, as Restore is: every rank's part of a
  // local step is brought here (a lost part fetched from a peer), so the
  // Restore that follows reads it locally. kNotFound when no tier holds
  // the step.
  struct PreparedRestore {
    int64_t step = 0;
    Tier tier = Tier::kDurable;
    // The step's manifest; of a split one (hoist/3) from the durable root,
    // its head: every array's extents empty (see ManifestHead).
    Manifest manifest;
    std::string note;            // with a local tier: what was chosen and why
    int64_t bytes_received = 0;  // parts fetched from peers, as Restore's
  };
  absl::StatusOr<PreparedRestore> PrepareRestore(std::optional<int64_t> step);

  // Restores `targets` from `step` (the latest committed step if nullopt).
  // kNotFound when there is no such step.
  // `receiver` gets the staged parts of destinations without a device or
  // memory (see RestoreDestination). `options`, when given, replace the
  // manager's restore options for this call. Only the extents that meet
  // `targets` are read: a subset of the step's arrays reads only theirs.
  absl::StatusOr<RestoreStats> Restore(
      std::optional<int64_t> step, absl::Span<const RestoreTarget> targets,
      const RestoreReceiver& receiver = nullptr,
      const std::optional<RestoreOptions>& options = std::nullopt);

  // Committed steps, ascending, and the newest.
  absl::StatusOr<std::vector<int64_t>> List() const;
  absl::StatusOr<std::optional<int64_t>> Latest() const;
  // Re-reads a committed step (see VerifyReport); `progress` (optional)
  // counts the bytes read.
  absl::StatusOr<VerifyReport> Verify(
      int64_t step, OperationProgress* progress = nullptr) const;
  // A committed step's validated manifest (CheckpointRoot::ReadManifest).
  absl::StatusOr<Manifest> ReadManifest(int64_t step) const;
  // Deletes a committed step. kFailedPrecondition for a step being saved.
  absl::Status Delete(int64_t step);

  const std::string& root() const;

  class Impl;

 private:
  explicit CheckpointManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_MANAGER_H_
