// TransferEngine: executes one process's share of a SavePlan, copying every
// slice off its device into leases of the staging pool. This is the time
// training is blocked.
//
// Default (batched, parallel): per wave, ONE CopyToHost per device carrying
// all of that device's slices, every device dispatched before any is awaited.
// Each staged extent goes to the sink as soon as its device's batch
// completes. When the share exceeds the pool, staging runs in waves of at
// most half the pool: a wave's leases are acquired all at once, from the
// pool when it has room, else from the overflow (host memory beside the
// pool, when the caller gave one: set_overflow) when that has room, else the
// wave waits (backpressure) until the sink has released enough of the
// earlier waves' pool leases.
//
// Baselines, kept only to measure against: DispatchMode::kPerSlice (one
// dispatch per slice, as Orbax does today) and WaitMode::kSequential
// (dispatch one, wait for it, then the next, as PyTorch/XLA did before it
// went asynchronous).
#ifndef HOIST_TRANSFER_TRANSFER_ENGINE_H_
#define HOIST_TRANSFER_TRANSFER_ENGINE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/base/first_error.h"
#include "hoist/device.h"
#include "hoist/future.h"
#include "hoist/save_plan.h"
#include "hoist/shard_producer.h"
#include "hoist/trace.h"
#include "hoist/transfer/staging_pool.h"

namespace hoist {

enum class DispatchMode { kBatched, kPerSlice };
enum class WaitMode { kParallel, kSequential };

struct TransferOptions {
  // One dispatch per device per wave (default), or one per slice.
  DispatchMode dispatch = DispatchMode::kBatched;
  // Dispatch everything, then wait (default); or wait after each dispatch.
  WaitMode wait = WaitMode::kParallel;
  // Records each dispatch on a "device N" track when set (default none).
  Tracer* tracer = nullptr;
};

// Where this process's shards live: for (array index in the plan, device),
// the base of the dense row-major buffer holding that device's shard of the
// array (in device memory). Not thread-safe to mutate while staging.
//
// A table of one column per device, indexed by array: a save fills it on
// the training thread for every shard of every array (11,600 at 3 GiB), so
// an Add is a store, not an allocation, and a lookup is a scan of the few
// devices a process drives and an index.
class ShardSources {
 public:
  // Devices are learned as shards are added.
  ShardSources() = default;
  // Only these devices: Add refuses a shard on any other.
  explicit ShardSources(absl::Span<const DeviceId> devices)
      : devices_(devices.begin(), devices.end()),
        columns_(devices.size()),
        fixed_devices_(true) {}

  // Room for arrays 0 .. arrays - 1 (Add grows it as needed).
  void Reserve(int arrays) { arrays_ = std::max(arrays_, arrays); }
  // A later Add of the same (array, device) replaces the earlier. False,
  // adding nothing, when `device` is not one of the devices this was made
  // with.
  bool Add(int array, DeviceId device, const void* base) {
    int d = IndexOf(device);
    if (d < 0) {
      if (fixed_devices_) return false;
      d = static_cast<int>(devices_.size());
      devices_.push_back(device);
      columns_.emplace_back();
    }
    std::vector<const void*>& column = columns_[d];
    if (array >= static_cast<int>(column.size())) {
      column.resize(std::max(array + 1, arrays_), nullptr);
    }
    column[array] = base;
    return true;
  }
  // Null if absent.
  const void* Find(int array, DeviceId device) const {
    return FindAt(array, IndexOf(device));
  }
  // `device`'s column, -1 if it has none: a caller looking up many shards
  // finds each device's column once, then uses FindAt.
  int IndexOf(DeviceId device) const {
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d] == device) return static_cast<int>(d);
    }
    return -1;
  }
  // Find in column `d` (IndexOf); null for d = -1.
  const void* FindAt(int array, int d) const {
    if (d < 0) return nullptr;
    const std::vector<const void*>& column = columns_[d];
    return array >= 0 && array < static_cast<int>(column.size()) ? column[array]
                                                                 : nullptr;
  }

 private:
  std::vector<DeviceId> devices_;
  // Per device (same order), each array's shard base, null where none.
  std::vector<std::vector<const void*>> columns_;
  int arrays_ = 0;  // Reserve's: a column's length once it has a shard
  bool fixed_devices_ = false;
};

// The source ShardSources::Add records for a shard its save's ShardProducer
// puts in host memory when a wave first reads it (TransferEngine::Begin).
inline const void* ProducedSource() {
  static const char tag = 0;
  return &tag;
}

// One slice, staged: plan.slices[slice] says its array, box, file, offset and
// length; the lease holds exactly its bytes (the box in C order).
struct StagedExtent {
  int slice = 0;
  Lease lease;
};

// Receives staged extents. OnStaged runs on device copy threads, possibly
// several at once, so it must be thread-safe and must not block for long
// (queue the extent and return). Releasing the lease returns its space to the
// pool and lets later waves proceed.
class StagedExtentSink {
 public:
  virtual ~StagedExtentSink() = default;
  virtual void OnStaged(StagedExtent extent) = 0;
};

struct TransferStats {
  int64_t slices = 0;      // slices staged
  int64_t bytes = 0;       // their bytes
  int64_t dispatches = 0;  // CopyToHost calls
  int64_t waves = 0;
  int64_t peak_pool_bytes = 0;  // most pool bytes reserved during this call
  // Bytes staged into the overflow (set_overflow) because the pool was full.
  int64_t overflow_bytes = 0;
  // Bytes of waves that found neither the pool nor the overflow with room,
  // and so waited for the sink (storage) to release earlier waves' leases:
  // 0 when staging waited only for the copies.
  int64_t stalled_bytes = 0;
  absl::Duration time_to_dispatched;  // until the last dispatch was issued
  absl::Duration time_to_staged;      // until every slice reached the sink
};

// What staging one process's share of a plan needs that no save changes:
// the share checked against the devices and the pool, each slice's copy
// beside it (so that staging reads this, contiguous, not the plan's
// slices), grouped into waves. TransferEngine::Lay makes it; a caller that
// saves the same plan again keeps it, and each Begin then only looks up
// the sources and dispatches.
struct StagingLayout {
  struct Slice {
    int slice = 0;   // in plan.slices
    int array = 0;   // plan.slices[slice].array
    int device = 0;  // index in the devices Lay was given
    SliceCopy copy;
  };
  std::vector<Slice> slices;      // wave after wave
  std::vector<int64_t> lengths;   // each slice's length_bytes, same order
  std::vector<size_t> wave_ends;  // wave w: [wave_ends[w - 1], wave_ends[w])
  int64_t bytes = 0;              // the share's length_bytes, summed
  // Each wave's slices grouped by device (a dispatch's batch): indices
  // into `slices`, wave by wave, device by device (in the devices Lay was
  // given); DeviceSlices(w, d) is one group.
  std::vector<size_t> by_device;
  std::vector<size_t> by_device_ends;  // per (wave, device), as wave_ends
  // A group is staged into one lease, its slices one after the other,
  // each 4 KiB-aligned: each by_device entry's offset in its group's
  // lease, and each group's bytes (0 for a device with none in a wave).
  std::vector<int64_t> group_offsets;
  std::vector<int64_t> group_bytes;

  absl::Span<const size_t> DeviceSlices(size_t wave, int device) const;
};

// Every slice's source for one layout, and, for arrays that stay where
// they are from save to save (CheckpointManager::Register), the copies
// prepared from them: a group whose lease lands in the pool where it did
// the last time dispatches its prepared copies again, and the thread
// dispatching builds and checks nothing per slice. A caller saving such
// arrays keeps one per layout and hands it to every Begin; the engine
// fills it and reads it, one staging at a time.
struct StableSources {
  // The layout's slices' order; empty until every one was found.
  std::vector<const uint8_t*> by_slice;
  // Per group (StagingLayout::group_bytes): its lease's first byte and the
  // copies prepared into it (null until a wave prepares them); empty when
  // nothing is kept from one staging to the next.
  struct Prepared {
    const uint8_t* base = nullptr;
    std::shared_ptr<const PreparedCopies> copies;
  };
  std::vector<Prepared> prepared;
};

class ProducedShards;  // transfer_engine.cc

// A staging begun by TransferEngine::Begin, its first wave dispatched:
// everything it carries from one wave to the next. Only the engine reads it.
struct StagingRun {
  std::shared_ptr<const StagingLayout> layout;
  // Each layout slice's shard base address (ShardSources); kept from save
  // to save, with the copies prepared from them, when Begin was given them.
  std::shared_ptr<StableSources> sources;
  absl::Span<Device* const> devices;
  StagedExtentSink* sink = nullptr;
  absl::Time start;
  TransferStats stats;  // stats.waves: the waves dispatched so far
  std::shared_ptr<FirstError> first_error = std::make_shared<FirstError>();
  std::vector<Future<>> delivered;
  // The shards a ShardProducer makes wave by wave (null when none): which
  // wave asks for each, and which releases it (transfer_engine.cc).
  std::shared_ptr<ProducedShards> produced;
};

// True when Begin dispatched every copy of `run` (the share fit in one
// wave): staging's on_dispatched moment has passed.
bool AllDispatched(const StagingRun& run);

// Stages one share at a time per pool. Thread-compatible: one Stage call
// (or Begin ... Finish) at a time per engine (and per pool); Lay, which
// reads only the plan and the pool's fixed capacity, may run beside them.
class TransferEngine {
 public:
  // `pool` must outlive the engine and every lease handed to a sink.
  explicit TransferEngine(StagingPool& pool, TransferOptions options = {})
      : pool_(pool), options_(options) {}

  // Where a wave goes when the pool has no room for it: host memory that
  // need not be pinned where the backend copies into it at full speed
  // (Backend::AllocateOverflow), so that a share larger than the pool is
  // staged at the copies' speed, not storage's. Null (default): waves wait
  // for the pool. Set it only while no staging runs; it must outlive every
  // lease handed to a sink from it.
  void set_overflow(StagingPool* overflow) { overflow_ = overflow; }

  // Stages every slice of `plan` whose process is `process`, copying from
  // `sources` on `devices` (this process's devices; they must include every
  // device the share uses) and handing each extent to `sink`. Returns when
  // every slice has been handed over, or when staging failed and every copy
  // already dispatched has finished (every lease of a failed copy is back in
  // the pool; extents handed over before the failure stay with the sink,
  // which must discard the save).
  // Errors: kFailedPrecondition when a slice's device is not in `devices`;
  // kInvalidArgument when a shard has no source; kResourceExhausted when a
  // slice is larger than the pool; a copy's own error otherwise.
  // `on_dispatched`, if set, runs on the calling thread once the last copy
  // has been enqueued (or when there was nothing to stage), before waiting
  // for them; not at all when staging stopped on an error first.
  // `after_first_wave`, if set, runs on the calling thread once the first
  // wave's copies are enqueued (not at all when staging stops before), while
  // they proceed: work the copies need not wait for (the save creates its
  // files there). Later waves that find room at once (in the pool or the
  // overflow) are dispatched before it; it runs before any wave waits for
  // the sink to free room. Its error stops staging as a copy's would.
  absl::StatusOr<TransferStats> Stage(
      const SavePlan& plan, int process, absl::Span<Device* const> devices,
      const ShardSources& sources, StagedExtentSink& sink,
      const std::function<void()>& on_dispatched = nullptr,
      const std::function<absl::Status()>& after_first_wave = nullptr);

  // Stage in two halves, which may run on two threads one after the other
  // (the CheckpointManager dispatches on the caller's thread, then its
  // saver finishes): Begin checks the share, cuts the waves and dispatches
  // the first wave (its errors are Stage's checks'; nothing is dispatched
  // then); Finish dispatches the rest and waits, as Stage does after its
  // first wave (on_dispatched runs at once in it when the first wave was
  // the last). Begin looks every slice's source up in `sources`, which it
  // then no longer needs. A run must be finished: its copies read the
  // arrays `sources` pointed to and deliver into `sink`, which must outlive
  // Finish.
  absl::StatusOr<std::unique_ptr<StagingRun>> Begin(
      const SavePlan& plan, int process, absl::Span<Device* const> devices,
      const ShardSources& sources, StagedExtentSink& sink);
  // Begin with a layout this engine made (Lay) for `plan` and `devices`:
  // only the sources are looked up. Errors: kInvalidArgument when a shard
  // has no source. With `stable` (the arrays have not moved since the
  // last Begin given it, for this layout), they are looked up once, into
  // it, and the copies are prepared once (see StableSources).
  // A shard whose source is ProducedSource() is asked of `producer` by the
  // first wave that reads it, after that wave's leases are had and once
  // every earlier wave's copies are done, in one Produce call with the
  // wave's other such shards (shard_producer.h); it is released once the
  // last wave reading it is copied, or when staging stops. Errors, before
  // anything is dispatched: kInvalidArgument for such a shard without a
  // producer, or with `stable`.
  absl::StatusOr<std::unique_ptr<StagingRun>> Begin(
      const SavePlan& plan, std::shared_ptr<const StagingLayout> layout,
      absl::Span<Device* const> devices, const ShardSources& sources,
      StagedExtentSink& sink, std::shared_ptr<StableSources> stable = nullptr,
      std::shared_ptr<ShardProducer> producer = nullptr);
  // The layout of `process`'s share of `plan` on `devices` through this
  // engine's pool: a pass over every slice of the job (of every process),
  // which a caller saving the same plan again makes once. `skip`, when
  // given (one entry per plan slice), leaves out the slices it marks: they
  // are not staged (a save's frozen arrays, referenced instead). Errors:
  // Stage's kFailedPrecondition and kResourceExhausted.
  absl::StatusOr<std::shared_ptr<const StagingLayout>> Lay(
      const SavePlan& plan, int process, absl::Span<Device* const> devices,
      const std::vector<uint8_t>* skip = nullptr) const;
  // `on_delivered`, if set, runs once every copy has been delivered to the
  // sink, with staging's status then (a copy's error, or after_first_wave's
  // if it failed by then) and its stats so far (every wave's figures are
  // final; the times are still to set), on the thread that delivered the last
  // copy (the calling thread if they were all delivered when the last wave was
  // dispatched): while after_first_wave may still run, so that a caller
  // learns its arrays are off the devices without waiting for that work.
  // Not at all when staging stopped before its last wave. Finish returns
  // after it has run.
  absl::StatusOr<TransferStats> Finish(
      std::unique_ptr<StagingRun> run,
      const std::function<void()>& on_dispatched = nullptr,
      const std::function<absl::Status()>& after_first_wave = nullptr,
      const std::function<void(const absl::Status&, const TransferStats&)>&
          on_delivered = nullptr);

 private:
  enum class Dispatched {
    kYes,
    kNo,         // an earlier error, or its leases': the run's first error
    kWouldWait,  // no room now, and it was not to wait
  };
  // Dispatches wave `wave` of `run`, waiting for room for its leases only
  // when `may_wait`.
  Dispatched DispatchWave(StagingRun& run, size_t wave, bool may_wait);
  // A wave's leases (sizes: one per device with slices in it): from the
  // pool if they fit now, else from the overflow if they fit there now,
  // else (when `may_wait`; nullopt otherwise) from the pool once they do,
  // counted in stats.stalled_bytes.
  absl::StatusOr<std::optional<std::vector<Lease>>> AcquireWave(
      absl::Span<const int64_t> sizes, TransferStats& stats, bool may_wait);
  // Dispatches device `d`'s group of wave `w` (its slices, one after the
  // other in `lease`): per slice, prepared once, or one batch, its copies
  // built in `ops` (the wave's, reused from group to group).
  void DispatchGroup(StagingRun& run, size_t w, size_t d, Lease lease,
                     std::vector<CopyOp>& ops);
  // Dispatches `slices` (of wave w, on device d) into `lease` through
  // `copy`; the completion hands each slice its range of the lease, on the
  // thread the copy completes on.
  void DispatchCopy(StagingRun& run, size_t w, size_t d,
                    absl::Span<const size_t> slices, Lease lease,
                    absl::FunctionRef<Future<>()> copy);

  StagingPool& pool_;
  StagingPool* overflow_ = nullptr;
  const TransferOptions options_;
};

}  // namespace hoist

#endif  // HOIST_TRANSFER_TRANSFER_ENGINE_H_
