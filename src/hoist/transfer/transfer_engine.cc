// Staging, step by step (1 and 2 are the layout, Lay, which a caller
// saving the same plan again makes once):
//   1. Check the share: every slice's device is local, every slice fits in
//      the pool.
//   2. Cut the share into waves: all of it when it fits in the pool, else
//      waves of at most half the pool (one wave copies while the previous
//      one drains), taking slices round-robin across devices so that every
//      wave keeps every device busy. Then (Begin) every shard's source is
//      looked up.
//   3. Per wave: acquire every lease of the wave at once (one per device,
//      its slices one after the other): from the pool when they fit now,
//      else from the overflow when there is one and they fit in it now,
//      else from the pool once the sink has released enough (backpressure:
//      the wave waits for storage). Then dispatch: one
//      CopyToHost per device (batched; copies prepared once when the
//      sources are stable) or per slice, all before waiting (parallel) or
//      each awaited in turn (sequential). A dispatch's completion callback
//      splits its lease and hands each slice's extent to the sink, or drops
//      the lease if the copy failed.
//      A wave reading shards a ShardProducer makes first waits, once its
//      leases are had, for every earlier wave's copies to end (their
//      shards are then released), then asks the producer for all of them
//      in one call before it dispatches.
//   4. Wait for every dispatch; stop cutting new waves after the first error.
//      Release every produced shard still held.
#include "hoist/transfer/transfer_engine.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/mutex.h"
#include "hoist/transfer/produced_shards.h"

namespace hoist {
namespace {

// A slice of the share waiting for its wave, with its length.
struct Queued {
  StagingLayout::Slice slice;
  int64_t length;
};

// Round-robin over devices, cut where the next slice would exceed `budget`:
// fills layout.slices, lengths and wave_ends.
void CutWaves(std::vector<std::deque<Queued>> queues, int64_t budget,
              StagingLayout& layout) {
  int64_t wave_bytes = 0;
  bool left = true;
  while (left) {
    left = false;
    for (std::deque<Queued>& queue : queues) {
      if (queue.empty()) continue;
      left = true;
      const Queued next = queue.front();
      queue.pop_front();
      const int64_t bytes = AlignUp(next.length, StagingPool::kAlignment);
      if (!layout.slices.empty() && wave_bytes + bytes > budget) {
        layout.wave_ends.push_back(layout.slices.size());
        wave_bytes = 0;
      }
      layout.slices.push_back(next.slice);
      layout.lengths.push_back(next.length);
      wave_bytes += bytes;
    }
  }
  if (!layout.slices.empty()) layout.wave_ends.push_back(layout.slices.size());
}

// Wave w's [begin, end) in the layout's slices.
std::pair<size_t, size_t> WaveRange(const StagingLayout& layout, size_t w) {
  return {w == 0 ? 0 : layout.wave_ends[w - 1], layout.wave_ends[w]};
}

// Group g's [begin, end) in the layout's by_device.
std::pair<size_t, size_t> GroupRange(const StagingLayout& layout, size_t g) {
  return {g == 0 ? 0 : layout.by_device_ends[g - 1], layout.by_device_ends[g]};
}

// Fills layout.by_device, by_device_ends, group_offsets and group_bytes
// from its slices and waves.
void GroupByDevice(int devices, StagingLayout& layout) {
  layout.by_device.reserve(layout.slices.size());
  layout.group_offsets.reserve(layout.slices.size());
  std::vector<std::vector<size_t>> groups(devices);
  for (size_t w = 0; w < layout.wave_ends.size(); ++w) {
    const auto [begin, end] = WaveRange(layout, w);
    for (size_t i = begin; i < end; ++i) {
      groups[layout.slices[i].device].push_back(i);
    }
    for (std::vector<size_t>& group : groups) {
      int64_t offset = 0;
      for (size_t i : group) {
        layout.by_device.push_back(i);
        layout.group_offsets.push_back(offset);
        offset += AlignUp(layout.lengths[i], StagingPool::kAlignment);
      }
      layout.by_device_ends.push_back(layout.by_device.size());
      layout.group_bytes.push_back(offset);
      group.clear();
    }
  }
}

// The copy of layout slice `i` from `sources` into `dst`.
CopyOp CopyOf(const StagingLayout& layout, const StableSources& sources,
              size_t i, uint8_t* dst) {
  const SliceCopy& copy = layout.slices[i].copy;
  return {sources.by_slice[i] + copy.src_offset_bytes,
          copy.src_pitch_bytes,
          dst,
          copy.width_bytes,
          copy.width_bytes,
          copy.rows};
}

}  // namespace

absl::Span<const size_t> StagingLayout::DeviceSlices(size_t wave,
                                                     int device) const {
  const size_t devices = by_device_ends.size() / wave_ends.size();
  const auto [begin, end] = GroupRange(*this, wave * devices + device);
  return absl::MakeConstSpan(by_device).subspan(begin, end - begin);
}

bool AllDispatched(const StagingRun& run) {
  return run.layout->wave_ends.size() == 1 && run.stats.waves == 1;
}

absl::StatusOr<TransferStats> TransferEngine::Stage(
    const SavePlan& plan, int process, absl::Span<Device* const> devices,
    const ShardSources& sources, StagedExtentSink& sink,
    const std::function<void()>& on_dispatched,
    const std::function<absl::Status()>& after_first_wave) {
  ASSIGN_OR_RETURN(std::unique_ptr<StagingRun> run,
                   Begin(plan, process, devices, sources, sink));
  return Finish(std::move(run), on_dispatched, after_first_wave);
}

absl::StatusOr<std::unique_ptr<StagingRun>> TransferEngine::Begin(
    const SavePlan& plan, int process, absl::Span<Device* const> devices,
    const ShardSources& sources, StagedExtentSink& sink) {
  ASSIGN_OR_RETURN(std::shared_ptr<const StagingLayout> layout,
                   Lay(plan, process, devices));
  return Begin(plan, std::move(layout), devices, sources, sink);
}

absl::StatusOr<std::shared_ptr<const StagingLayout>> TransferEngine::Lay(
    const SavePlan& plan, int process, absl::Span<Device* const> devices,
    const std::vector<uint8_t>* skip) const {
  // 1. Check the share and group it by device.
  absl::flat_hash_map<DeviceId, int> local;  // device id -> index in devices
  for (int i = 0; i < static_cast<int>(devices.size()); ++i) {
    local[devices[i]->id()] = i;
  }
  std::vector<std::deque<Queued>> per_device(devices.size());
  int64_t share_bytes = 0;
  auto layout = std::make_shared<StagingLayout>();
  const std::vector<int>& share = plan.SlicesOfProcess(process);
  for (int s : share) {
    if (skip != nullptr && (*skip)[s]) continue;
    const PlannedSlice& slice = plan.slices[s];
    const std::string& name = plan.arrays[slice.array].name;
    auto it = local.find(slice.device);
    if (it == local.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "array '%s': slice %s is planned on device %d, which process %d "
          "does not drive",
          name, slice.box.ToString(), slice.device, process));
    }
    const int64_t bytes = AlignUp(slice.length_bytes, StagingPool::kAlignment);
    if (bytes > pool_.capacity_bytes()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "array '%s': slice %s needs %s but the staging pool holds %s; "
          "raise the pool capacity or lower min_slice_bytes",
          name, slice.box.ToString(), FormatBytes(bytes),
          FormatBytes(pool_.capacity_bytes())));
    }
    per_device[it->second].push_back(
        {{s, slice.array, it->second, slice.copy}, slice.length_bytes});
    share_bytes += bytes;
    layout->bytes += slice.length_bytes;
  }

  // 2. Waves.
  const int64_t budget = share_bytes <= pool_.capacity_bytes()
                             ? pool_.capacity_bytes()
                             : pool_.capacity_bytes() / 2;
  layout->slices.reserve(share.size());
  layout->lengths.reserve(share.size());
  CutWaves(std::move(per_device), budget, *layout);
  GroupByDevice(static_cast<int>(devices.size()), *layout);
  return layout;
}

absl::StatusOr<std::unique_ptr<StagingRun>> TransferEngine::Begin(
    const SavePlan& plan, std::shared_ptr<const StagingLayout> layout,
    absl::Span<Device* const> devices, const ShardSources& sources,
    StagedExtentSink& sink, std::shared_ptr<StableSources> stable,
    std::shared_ptr<ShardProducer> producer) {
  auto run = std::make_unique<StagingRun>();
  run->devices = devices;
  run->sink = &sink;
  run->start = absl::Now();
  const bool keep = stable != nullptr;
  run->sources = keep ? std::move(stable) : std::make_shared<StableSources>();
  pool_.ResetPeak();
  StableSources& resolved = *run->sources;
  if (resolved.by_slice.size() != layout->slices.size()) {
    // Every slice's source, looked up once, each device's column found once.
    std::vector<int> column(devices.size());
    for (size_t d = 0; d < devices.size(); ++d) {
      column[d] = sources.IndexOf(devices[d]->id());
    }
    std::vector<const uint8_t*> by_slice(layout->slices.size());
    std::vector<size_t> produced;  // set wave by wave (ProducedShards)
    for (size_t i = 0; i < layout->slices.size(); ++i) {
      const StagingLayout::Slice& slice = layout->slices[i];
      const void* source = sources.FindAt(slice.array, column[slice.device]);
      if (source == nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': no source buffer for its shard on device %d",
            plan.arrays[slice.array].name, devices[slice.device]->id()));
      }
      if (source == ProducedSource()) {
        if (producer == nullptr || keep) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "array '%s': its shard on device %d is to be produced, but %s",
              plan.arrays[slice.array].name, devices[slice.device]->id(),
              keep ? "registered arrays cannot be"
                   : "the save has no producer (SaveOptions::producer)"));
        }
        produced.push_back(i);
        source = nullptr;
      }
      by_slice[i] = static_cast<const uint8_t*>(source);
    }
    if (!produced.empty()) {
      run->produced = std::make_shared<ProducedShards>(
          std::move(producer), *layout, devices, produced);
    }
    resolved.by_slice = std::move(by_slice);
    resolved.prepared.assign(keep ? layout->group_bytes.size() : 0, {});
  }
  run->stats.slices = static_cast<int64_t>(layout->slices.size());
  run->stats.bytes = layout->bytes;
  run->layout = std::move(layout);

  // 3, for the first wave.
  if (!run->layout->wave_ends.empty()) {
    DispatchWave(*run, 0, /*may_wait=*/true);
  }
  return run;
}

absl::StatusOr<TransferStats> TransferEngine::Finish(
    std::unique_ptr<StagingRun> run, const std::function<void()>& on_dispatched,
    const std::function<absl::Status()>& after_first_wave,
    const std::function<void(const absl::Status&, const TransferStats&)>&
        on_delivered) {
  TransferStats& stats = run->stats;
  bool announced = false;
  const auto announce_dispatched = [&] {
    if (std::exchange(announced, true)) return;
    stats.time_to_dispatched = absl::Now() - run->start;
    if (on_dispatched) on_dispatched();
  };
  // Set once on_delivered has run (it may run on a copy's thread, which
  // may still be inside Notify when this frame waits and returns: shared).
  const auto delivered_reported = std::make_shared<Notification>();
  bool reporting = false;
  bool prepared = false;  // after_first_wave has run
  const auto prepare = [&] {
    if (std::exchange(prepared, true) || !after_first_wave) return;
    run->first_error->Record(after_first_wave());
  };
  // 3. Dispatch wave after wave (Begin dispatched the first), stopping at
  // the first error. A later wave that finds room now is dispatched before
  // the first wave's work; one that must wait for the sink to free the
  // pool waits after it (that work may be what lets the sink write).
  const size_t waves = run->layout->wave_ends.size();
  for (size_t wave = 0; wave < waves; ++wave) {
    if (wave == 0) {
      if (run->stats.waves == 0) break;
    } else {
      Dispatched dispatched = DispatchWave(*run, wave, /*may_wait=*/prepared);
      if (dispatched == Dispatched::kWouldWait) {
        prepare();
        dispatched = DispatchWave(*run, wave, /*may_wait=*/true);
      }
      if (dispatched != Dispatched::kYes) break;
    }
    // The last wave is announced before the first wave's work begins.
    if (wave + 1 == waves) {
      announce_dispatched();
      if (on_delivered) {
        reporting = true;
        WhenAll(run->delivered)
            .OnReady([&on_delivered, &stats, reported = delivered_reported,
                      first_error = run->first_error](const absl::Status&) {
              on_delivered(first_error->Get(), stats);
              reported->Notify();
            });
      }
    }
  }
  if (run->stats.waves > 0) prepare();
  // Nothing to stage, or staging stopped early: on an error, the caller
  // learns it from Finish's result instead (a save waiting to be
  // dispatched is told it failed, not that it was dispatched).
  if (run->first_error->Get().ok()) announce_dispatched();

  // 4. Wait for everything in flight (and for on_delivered, which uses
  // this frame).
  WhenAll(run->delivered).Wait();
  if (run->produced != nullptr) run->produced->ReleaseRest();
  if (reporting) delivered_reported->WaitForNotification();
  stats.time_to_staged = absl::Now() - run->start;
  stats.peak_pool_bytes = pool_.stats().peak_bytes;
  if (absl::Status status = run->first_error->Get(); !status.ok()) {
    return status;
  }
  return stats;
}

absl::StatusOr<std::optional<std::vector<Lease>>> TransferEngine::AcquireWave(
    absl::Span<const int64_t> sizes, TransferStats& stats, bool may_wait) {
  ASSIGN_OR_RETURN(std::optional<std::vector<Lease>> leases,
                   pool_.TryAcquireAll(sizes));
  if (leases) return leases;
  int64_t bytes = 0;
  for (int64_t size : sizes) bytes += AlignUp(size, StagingPool::kAlignment);
  if (overflow_ != nullptr && bytes <= overflow_->capacity_bytes()) {
    absl::StatusOr<std::optional<std::vector<Lease>>> beside =
        overflow_->TryAcquireAll(sizes);
    // An overflow whose memory could not be had leaves the wave to the
    // pool, as if there were none.
    if (beside.ok() && *beside) {
      stats.overflow_bytes += bytes;
      return beside;
    }
  }
  if (!may_wait) return std::nullopt;
  stats.stalled_bytes += bytes;
  ASSIGN_OR_RETURN(leases, pool_.AcquireAll(sizes));
  return leases;
}

TransferEngine::Dispatched TransferEngine::DispatchWave(StagingRun& run,
                                                        size_t w,
                                                        bool may_wait) {
  if (!run.first_error->Get().ok()) return Dispatched::kNo;
  const StagingLayout& layout = *run.layout;
  const size_t devices = run.devices.size();
  // One lease per device with slices in the wave, its slices one after
  // the other (group_offsets), all acquired at once: the caller's thread
  // acquires as many leases as there are devices, not slices.
  absl::InlinedVector<int64_t, 16> sizes;
  for (size_t d = 0; d < devices; ++d) {
    if (const int64_t bytes = layout.group_bytes[w * devices + d]; bytes > 0) {
      sizes.push_back(bytes);
    }
  }
  absl::StatusOr<std::optional<std::vector<Lease>>> acquired =
      AcquireWave(sizes, run.stats, may_wait);
  if (!acquired.ok()) {
    run.first_error->Record(acquired.status());
    return Dispatched::kNo;
  }
  if (!*acquired) return Dispatched::kWouldWait;
  std::vector<Lease>& leases = **acquired;
  ProducedShards* const produced = run.produced.get();
  if (produced != nullptr) {
    if (absl::Status made =
            produced->Produce(w, run.sources->by_slice, options_.tracer);
        !made.ok()) {
      run.first_error->Record(made);
      return Dispatched::kNo;  // the leases go back with `acquired`
    }
    produced->BeginWave(w);
  }
  ++run.stats.waves;
  // Every device's copies are enqueued before any starts: on the host
  // backend the first devices' copies would take the cores from this loop.
  for (Device* device : run.devices) device->HoldCopies();
  size_t next_lease = 0;
  std::vector<CopyOp> ops;  // each group's copies: one allocation a wave
  for (size_t d = 0; d < devices; ++d) {
    const std::pair<size_t, size_t> range = GroupRange(layout, w * devices + d);
    if (range.first == range.second) continue;
    DispatchGroup(run, w, d, std::move(leases[next_lease++]), ops);
  }
  for (Device* device : run.devices) device->ReleaseCopies();
  if (produced != nullptr) produced->EndWave(w);
  return Dispatched::kYes;
}

void TransferEngine::DispatchGroup(StagingRun& run, size_t w, size_t d,
                                   Lease lease, std::vector<CopyOp>& ops) {
  const StagingLayout& layout = *run.layout;
  Device& device = *run.devices[d];
  const size_t group = w * run.devices.size() + d;
  // Not a structured binding: clang 14 cannot capture one (build_ops).
  const std::pair<size_t, size_t> range = GroupRange(layout, group);
  const size_t begin = range.first, end = range.second;
  const absl::Span<const size_t> slices =
      absl::MakeConstSpan(layout.by_device).subspan(begin, end - begin);
  uint8_t* const base = lease.data();
  const auto build_ops = [&] {
    ops.clear();
    for (size_t k = begin; k < end; ++k) {
      ops.push_back(CopyOf(layout, *run.sources, layout.by_device[k],
                           base + layout.group_offsets[k]));
    }
  };
  if (options_.dispatch == DispatchMode::kPerSlice) {
    for (size_t k = 0; k < slices.size(); ++k) {
      Lease own = lease.TakeFront(layout.lengths[slices[k]]);
      const CopyOp op = CopyOf(layout, *run.sources, slices[k], own.data());
      DispatchCopy(run, w, d, slices.subspan(k, 1), std::move(own), [&] {
        return device.CopyToHost({&op, 1});
      });
    }
  } else if (!run.sources->prepared.empty()) {
    // Prepared once for where this group's lease lands; an empty pool
    // places a wave where it placed the last one.
    StableSources::Prepared& kept = run.sources->prepared[group];
    absl::Status prepared;
    if (kept.copies == nullptr || kept.base != base) {
      build_ops();
      absl::StatusOr<std::shared_ptr<const PreparedCopies>> copies =
          device.PrepareCopiesToHost(ops);
      kept = {};
      if (copies.ok()) {
        kept = {base, *std::move(copies)};
      } else {
        prepared = copies.status();
      }
    }
    DispatchCopy(run, w, d, slices, std::move(lease), [&] {
      return prepared.ok() ? device.CopyPreparedToHost(kept.copies)
                           : Future<>::Ready(prepared);
    });
  } else {
    build_ops();
    DispatchCopy(run, w, d, slices, std::move(lease),
                 [&] { return device.CopyToHost(ops); });
  }
}

void TransferEngine::DispatchCopy(StagingRun& run, size_t w, size_t d,
                                  absl::Span<const size_t> slices, Lease lease,
                                  absl::FunctionRef<Future<>()> copy) {
  const absl::Time dispatched_at = absl::Now();
  if (run.produced != nullptr) run.produced->AddCopy(w);
  Future<> copied = copy();
  ++run.stats.dispatches;
  Promise<> done;
  run.delivered.push_back(done.future());
  std::string span;
  if (options_.tracer != nullptr) {
    int64_t bytes = 0;
    for (size_t i : slices) bytes += run.layout->lengths[i];
    span = absl::StrFormat("copy %d slices, %s", slices.size(),
                           FormatBytes(static_cast<double>(bytes)));
  }
  // The layout (kept alive here) holds the slices.
  copied.OnReady([layout = run.layout, slices, lease = std::move(lease),
                  sink = run.sink, first_error = run.first_error,
                  done = std::move(done), tracer = options_.tracer,
                  device = run.devices[d]->id(), span = std::move(span),
                  dispatched_at, produced = run.produced,
                  w](const absl::Status& status) mutable {
    if (tracer != nullptr) {
      tracer->Span(absl::StrFormat("device %d", device), span, dispatched_at,
                   absl::Now());
    }
    if (status.ok()) {
      for (size_t i : slices) {
        sink->OnStaged(
            {layout->slices[i].slice, lease.TakeFront(layout->lengths[i])});
      }
    } else {
      first_error->Record(status);
      lease.Release();  // the copy is over: the lease can go back
    }
    // Before `done`: a save reported staged holds no produced shard.
    if (produced != nullptr) produced->CopyDone(w);
    done.Set(status);
  });
  if (options_.wait == WaitMode::kSequential) {
    run.devices[d]->ReleaseCopies();
    run.delivered.back().Wait();
  }
}

}  // namespace hoist
