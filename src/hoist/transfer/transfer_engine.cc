// Staging, step by step (1 and 2 are the layout, Lay, which a caller
// saving the same plan again makes once):
//   1. Check the share: every slice's device is local, every slice fits in
//      the pool.
//   2. Cut the share into waves: all of it when it fits in the pool, else
//      waves of at most half the pool (one wave copies while the previous
//      one drains), taking slices round-robin across devices so that every
//      wave keeps every device busy. Then (Begin) every shard's source is
//      looked up.
//   3. Per wave: acquire every lease of the wave at once (backpressure), then
//      dispatch: one CopyToHost per device (batched) or per slice, all before
//      waiting (parallel) or each awaited in turn (sequential). A dispatch's
//      completion callback hands its extents to the sink, or drops their
//      leases if the copy failed.
//   4. Wait for every dispatch; stop cutting new waves after the first error.
#include "hoist/transfer/transfer_engine.h"

#include <algorithm>
#include <deque>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"

namespace hoist {
namespace {

// One dispatch's worth of work: its slices (indices into the layout's
// slices) and their ops, in the same order.
struct Batch {
  Device* device = nullptr;
  absl::Span<const size_t> slices;
  std::vector<CopyOp> ops;
};

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

// Fills layout.by_device and by_device_ends from its slices and waves.
void GroupByDevice(int devices, StagingLayout& layout) {
  layout.by_device.reserve(layout.slices.size());
  std::vector<std::vector<size_t>> groups(devices);
  for (size_t w = 0; w < layout.wave_ends.size(); ++w) {
    const auto [begin, end] = WaveRange(layout, w);
    for (size_t i = begin; i < end; ++i) {
      groups[layout.slices[i].device].push_back(i);
    }
    for (std::vector<size_t>& group : groups) {
      layout.by_device.insert(layout.by_device.end(), group.begin(),
                              group.end());
      layout.by_device_ends.push_back(layout.by_device.size());
      group.clear();
    }
  }
}

}  // namespace

absl::Span<const size_t> StagingLayout::DeviceSlices(size_t wave,
                                                     int device) const {
  const size_t devices = by_device_ends.size() / wave_ends.size();
  const size_t group = wave * devices + device;
  const size_t begin = group == 0 ? 0 : by_device_ends[group - 1];
  return absl::MakeConstSpan(by_device).subspan(begin,
                                                by_device_ends[group] - begin);
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
    const SavePlan& plan, int process,
    absl::Span<Device* const> devices) const {
  // 1. Check the share and group it by device.
  absl::flat_hash_map<DeviceId, int> local;  // device id -> index in devices
  for (int i = 0; i < static_cast<int>(devices.size()); ++i) {
    local[devices[i]->id()] = i;
  }
  std::vector<std::deque<Queued>> per_device(devices.size());
  int64_t share_bytes = 0;
  auto layout = std::make_shared<StagingLayout>();
  const std::vector<int> share = plan.SlicesOfProcess(process);
  for (int s : share) {
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
    StagedExtentSink& sink) {
  auto run = std::make_unique<StagingRun>();
  run->devices = devices;
  run->sink = &sink;
  run->start = absl::Now();
  pool_.ResetPeak();
  // Every slice's source, looked up once, each device's column found once.
  std::vector<int> column(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    column[d] = sources.IndexOf(devices[d]->id());
  }
  run->sources.resize(layout->slices.size());
  for (size_t i = 0; i < layout->slices.size(); ++i) {
    const StagingLayout::Slice& slice = layout->slices[i];
    const void* source = sources.FindAt(slice.array, column[slice.device]);
    if (source == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "array '%s': no source buffer for its shard on device %d",
          plan.arrays[slice.array].name, devices[slice.device]->id()));
    }
    run->sources[i] = static_cast<const uint8_t*>(source);
  }
  run->stats.slices = static_cast<int64_t>(layout->slices.size());
  run->stats.bytes = layout->bytes;
  run->layout = std::move(layout);

  // 3, for the first wave.
  if (!run->layout->wave_ends.empty()) DispatchWave(*run, 0);
  return run;
}

absl::StatusOr<TransferStats> TransferEngine::Finish(
    std::unique_ptr<StagingRun> run, const std::function<void()>& on_dispatched,
    const std::function<absl::Status()>& after_first_wave) {
  TransferStats& stats = run->stats;
  bool announced = false;
  const auto announce_dispatched = [&] {
    if (std::exchange(announced, true)) return;
    stats.time_to_dispatched = absl::Now() - run->start;
    if (on_dispatched) on_dispatched();
  };
  // 3. Dispatch wave after wave (Begin dispatched the first), stopping at
  // the first error.
  const size_t waves = run->layout->wave_ends.size();
  for (size_t wave = 0; wave < waves; ++wave) {
    if (wave == 0 ? run->stats.waves == 0 : !DispatchWave(*run, wave)) break;
    // The last wave is announced before the first wave's work begins.
    if (wave + 1 == waves) announce_dispatched();
    if (wave == 0 && after_first_wave) {
      run->first_error->Record(after_first_wave());
    }
  }
  announce_dispatched();  // staging stopped early, or nothing to stage

  // 4. Wait for everything in flight.
  WhenAll(run->delivered).Wait();
  stats.time_to_staged = absl::Now() - run->start;
  stats.peak_pool_bytes = pool_.stats().peak_bytes;
  if (absl::Status status = run->first_error->Get(); !status.ok()) {
    return status;
  }
  return stats;
}

bool TransferEngine::DispatchWave(StagingRun& run, size_t w) {
  if (!run.first_error->Get().ok()) return false;
  const StagingLayout& layout = *run.layout;
  const auto [begin, end] = WaveRange(layout, w);
  absl::StatusOr<std::vector<Lease>> leases = pool_.AcquireAll(
      absl::MakeConstSpan(layout.lengths).subspan(begin, end - begin));
  if (!leases.ok()) {
    run.first_error->Record(leases.status());
    return false;
  }
  // The wave's leases, shared by its dispatches: each hands its own
  // slices' leases to the sink from the thread its copy completes on, so
  // that this (the caller's) thread only builds the ops.
  auto wave_leases = std::make_shared<std::vector<Lease>>(*std::move(leases));
  TransferStats& stats = run.stats;
  ++stats.waves;

  // Batches: each device's slices of the wave (batched), or one per slice.
  std::vector<Batch> batches;
  const bool per_slice = options_.dispatch == DispatchMode::kPerSlice;
  batches.reserve(per_slice ? end - begin : run.devices.size());
  for (int d = 0; d < static_cast<int>(run.devices.size()); ++d) {
    const absl::Span<const size_t> slices = layout.DeviceSlices(w, d);
    for (size_t first = 0; first < slices.size();
         first += per_slice ? 1 : slices.size()) {
      Batch& batch = batches.emplace_back();
      batch.device = run.devices[d];
      batch.slices = slices.subspan(first, per_slice ? 1 : slices.size());
      batch.ops.reserve(batch.slices.size());
      for (size_t i : batch.slices) {
        const SliceCopy& copy = layout.slices[i].copy;
        void* dst = (*wave_leases)[i - begin].data();
        batch.ops.push_back({run.sources[i] + copy.src_offset_bytes,
                             copy.src_pitch_bytes, dst, copy.width_bytes,
                             copy.width_bytes, copy.rows});
      }
    }
  }
  // Every device's copies are enqueued before any starts: on the host
  // backend the first devices' copies would take the cores from this loop.
  for (Batch& batch : batches) batch.device->HoldCopies();
  for (Batch& batch : batches) {
    const absl::Time dispatched_at = absl::Now();
    Future<> copied = batch.device->CopyToHost(batch.ops);
    ++stats.dispatches;
    Promise<> done;
    run.delivered.push_back(done.future());
    std::string span;
    if (options_.tracer != nullptr) {
      int64_t bytes = 0;
      for (const CopyOp& op : batch.ops) bytes += op.bytes();
      span = absl::StrFormat("copy %d slices, %s", batch.ops.size(),
                             FormatBytes(static_cast<double>(bytes)));
    }
    // The layout (kept alive here) holds the batch's slices.
    copied.OnReady([layout = run.layout, slices = batch.slices, wave = begin,
                    wave_leases, sink = run.sink, first_error = run.first_error,
                    done = std::move(done), tracer = options_.tracer,
                    device = batch.device->id(), span = std::move(span),
                    dispatched_at](const absl::Status& status) mutable {
      if (tracer != nullptr) {
        tracer->Span(absl::StrFormat("device %d", device), span, dispatched_at,
                     absl::Now());
      }
      if (!status.ok()) first_error->Record(status);
      for (size_t i : slices) {
        Lease& lease = (*wave_leases)[i - wave];
        if (status.ok()) {
          sink->OnStaged({layout->slices[i].slice, std::move(lease)});
        } else {
          lease.Release();  // the copy is over: the lease can go back
        }
      }
      done.Set(status);
    });
    if (options_.wait == WaitMode::kSequential) {
      batch.device->ReleaseCopies();
      run.delivered.back().Wait();
    }
  }
  for (Batch& batch : batches) batch.device->ReleaseCopies();
  return true;
}

}  // namespace hoist
