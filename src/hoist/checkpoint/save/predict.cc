// PredictSave and MeasureSaveRates (see include/hoist/predict.h).
#include "hoist/predict.h"

#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/first_error.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"

namespace hoist {
namespace {

constexpr int64_t kWriteBytes = int64_t{16} << 20;  // as the ExtentWriter's
constexpr int kThreadsPerStream = 2;                // as the save's

double Seconds(int64_t bytes, double gbps) { return bytes / (gbps * 1e9); }

}  // namespace

absl::StatusOr<SavePrediction> PredictSave(const SavePlan& plan,
                                           const Topology& topology,
                                           int64_t pool_bytes,
                                           const SaveRates& rates,
                                           int64_t host_memory_bytes) {
  if (!(rates.d2h_gbps > 0) || !(rates.write_gbps > 0) ||
      !(rates.host_gbps >= 0) || !(rates.fs_gbps >= 0) ||
      !(rates.dispatch_s >= 0) || !(rates.per_slice_s >= 0) ||
      !(rates.commit_s >= 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rates must be positive (d2h %g GB/s, write %g GB/s) and none "
        "negative",
        rates.d2h_gbps, rates.write_gbps));
  }
  if (pool_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("pool of %d bytes", pool_bytes));
  }
  const int processes = topology.num_processes();
  std::vector<int64_t> process_bytes(processes, 0), pool_need(processes, 0),
      slices(processes, 0);
  absl::flat_hash_map<DeviceId, int64_t> device_bytes;
  int64_t total = 0;
  for (const PlannedSlice& slice : plan.slices) {
    if (slice.process < 0 || slice.process >= processes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the plan's slice on device %d belongs to process %d of %d",
          slice.device, slice.process, processes));
    }
    process_bytes[slice.process] += slice.length_bytes;
    pool_need[slice.process] +=
        AlignUp(slice.length_bytes, plan.options.alignment_bytes);
    ++slices[slice.process];
    device_bytes[slice.device] += slice.length_bytes;
    total += slice.length_bytes;
  }
  SavePrediction worst;  // the process whose save takes longest
  double blocked = -1;
  std::string blocked_bound;
  for (int p = 0; p < processes; ++p) {
    int64_t busiest = 0, devices_with_work = 0;
    for (DeviceId d : topology.devices(p)) {
      auto it = device_bytes.find(d);
      if (it == device_bytes.end()) continue;
      busiest = std::max(busiest, it->second);
      ++devices_with_work;
    }
    const double host_gbps =
        rates.host_gbps > 0
            ? rates.host_gbps
            : rates.d2h_gbps * std::max<int64_t>(1, devices_with_work);
    SavePrediction cost;
    cost.slowest_process = p;
    cost.process_bytes = process_bytes[p];
    cost.device_bytes = busiest;
    cost.waves =
        std::max<int64_t>(1, (pool_need[p] + pool_bytes - 1) / pool_bytes);
    cost.copy_s = std::max(Seconds(busiest, rates.d2h_gbps),
                           Seconds(process_bytes[p], host_gbps));
    cost.write_s = Seconds(process_bytes[p], rates.write_gbps);
    const double overhead =
        static_cast<double>(devices_with_work * cost.waves) * rates.dispatch_s +
        static_cast<double>(slices[p]) * rates.per_slice_s;
    // Beyond the host memory a save may hold (the pool and its overflow),
    // staging waits for the writes that free it.
    const int64_t held = std::max(pool_bytes, host_memory_bytes);
    const double pool_wait =
        Seconds(std::max<int64_t>(0, pool_need[p] - held), rates.write_gbps);
    cost.blocked_s = overhead + cost.copy_s + pool_wait;
    cost.blocked_bound = pool_wait == 0      ? "copy"
                         : held > pool_bytes ? "budget"
                                             : "pool";
    // A device's extents reach the writers once its dispatch has landed:
    // the first wave's copies come before any write.
    const double first_wave = cost.copy_s / static_cast<double>(cost.waves);
    cost.save_s = overhead + first_wave +
                  std::max(cost.copy_s - first_wave, cost.write_s);
    cost.save_bound = cost.write_s >= cost.copy_s ? "write" : "copy";
    if (cost.blocked_s > blocked) {
      blocked = cost.blocked_s;
      blocked_bound = cost.blocked_bound;
    }
    if (p == 0 || cost.save_s > worst.save_s) worst = std::move(cost);
  }
  worst.blocked_s = blocked;
  worst.blocked_bound = blocked_bound;
  if (rates.fs_gbps > 0 && Seconds(total, rates.fs_gbps) > worst.save_s) {
    worst.save_s = Seconds(total, rates.fs_gbps);
    worst.save_bound = "filesystem";
  }
  worst.save_s += rates.commit_s;
  return worst;
}

namespace {

// Bytes per second of `copy` (which returns once its copies landed): the
// median of five, after one to warm up (the best of a few would take a
// moment when a shared machine's other work paused).
template <typename Copy>
absl::StatusOr<double> MedianRate(int64_t bytes, Copy copy) {
  RETURN_IF_ERROR(copy());
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(copy());
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::nth_element(seconds.begin(), seconds.begin() + 2, seconds.end());
  return bytes / std::max(1e-9, seconds[2]);
}

absl::Status MeasureCopies(Backend& backend, int64_t bytes, SaveRates& rates) {
  absl::Span<Device* const> devices = backend.devices();
  if (devices.empty()) {
    return absl::FailedPreconditionError("the backend has no devices");
  }
  const int64_t per_device =
      AlignUp(std::max<int64_t>(bytes / static_cast<int64_t>(devices.size()),
                                int64_t{8} << 20),
              4096);
  ASSIGN_OR_RETURN(MemoryBlock pinned,
                   backend.AllocatePinned(per_device * devices.size()));
  auto* host = static_cast<uint8_t*>(pinned.data());
  for (int64_t i = 0; i < pinned.size_bytes(); i += 4096) {
    host[i] = static_cast<uint8_t>(i >> 12);
  }
  std::vector<MemoryBlock> memory;
  std::vector<CopyOp> down;
  for (size_t d = 0; d < devices.size(); ++d) {
    ASSIGN_OR_RETURN(MemoryBlock block, devices[d]->Allocate(per_device));
    uint8_t* slot = host + d * per_device;
    const CopyOp up{slot, per_device, block.data(), per_device, per_device, 1};
    RETURN_IF_ERROR(devices[d]->CopyFromHost({&up, 1}).Wait());
    down.push_back({block.data(), per_device, slot, per_device, per_device, 1});
    memory.push_back(std::move(block));
  }
  ASSIGN_OR_RETURN(const double alone, MedianRate(per_device, [&] {
                     return devices[0]->CopyToHost({&down[0], 1}).Wait();
                   }));
  ASSIGN_OR_RETURN(
      const double all,
      MedianRate(per_device * static_cast<int64_t>(devices.size()), [&] {
        std::vector<Future<>> copies;
        for (size_t d = 0; d < devices.size(); ++d) {
          copies.push_back(devices[d]->CopyToHost({&down[d], 1}));
        }
        return WhenAll(copies).Wait();
      }));
  rates.d2h_gbps = alone / 1e9;
  rates.host_gbps = all / 1e9;
  return absl::OkStatus();
}

absl::Status MeasureWrites(Backend& backend, Storage& storage,
                           const std::string& dir, int64_t bytes, int streams,
                           SaveRates& rates) {
  const int threads = streams * kThreadsPerStream;
  const int64_t per_stream = AlignUp(
      std::max<int64_t>(bytes / streams, kWriteBytes * kThreadsPerStream),
      kWriteBytes);
  ASSIGN_OR_RETURN(MemoryBlock buffers,
                   backend.AllocatePinned(kWriteBytes * threads));
  auto* data = static_cast<uint64_t*>(buffers.data());
  uint64_t x = 0x9e3779b97f4a7c15;  // data a filesystem cannot compress
  for (int64_t i = 0; i < buffers.size_bytes() / 8; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    data[i] = x;
  }
  std::vector<std::unique_ptr<WritableFile>> files;
  for (int s = 0; s < streams; ++s) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<WritableFile> file,
        storage.OpenWritable(absl::StrFormat("%s/w%02d.bin", dir, s)));
    files.push_back(std::move(file));
  }
  FirstError error;
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      WritableFile& file = *files[t / kThreadsPerStream];
      const absl::Span<const uint8_t> chunk(
          static_cast<const uint8_t*>(buffers.data()) + t * kWriteBytes,
          kWriteBytes);
      for (int64_t offset = (t % kThreadsPerStream) * kWriteBytes;
           offset < per_stream && error.Get().ok();
           offset += kThreadsPerStream * kWriteBytes) {
        volatile XXH64_hash_t hash = XXH3_64bits(chunk.data(), chunk.size());
        (void)hash;
        error.Record(file.WriteAt(offset, chunk));
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  RETURN_IF_ERROR(error.Get());
  for (std::unique_ptr<WritableFile>& file : files) {
    RETURN_IF_ERROR(file->Sync());
    RETURN_IF_ERROR(file->Close());
  }
  rates.write_gbps =
      per_stream * streams / 1e9 / absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

// A commit's storage work: a small file written and synced, its directory
// synced, renamed into place, the parent synced.
absl::Status MeasureCommit(Storage& storage, const std::string& dir,
                           SaveRates& rates) {
  const absl::Time start = absl::Now();
  const std::string tmp = dir + "/commit.tmp";
  RETURN_IF_ERROR(storage.CreateDir(tmp));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   storage.OpenWritable(tmp + "/manifest"));
  const std::vector<uint8_t> manifest(4096, '{');
  RETURN_IF_ERROR(file->WriteAt(0, manifest));
  RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(file->Close());
  RETURN_IF_ERROR(storage.SyncDir(tmp));
  RETURN_IF_ERROR(storage.Rename(tmp, dir + "/commit"));
  RETURN_IF_ERROR(storage.SyncDir(dir));
  rates.commit_s = absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveRates> MeasureSaveRates(Backend& backend, Storage& storage,
                                           const std::string& dir,
                                           const MeasureRatesOptions& options) {
  if (options.bytes < 1 || options.writer_streams < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("measuring %d bytes with %d writer streams",
                        options.bytes, options.writer_streams));
  }
  SaveRates rates;
  const std::string scratch =
      absl::StrFormat("%s/.hoist-rates.%d", dir, getpid());
  RETURN_IF_ERROR(storage.RemoveAll(scratch));
  RETURN_IF_ERROR(storage.CreateDir(scratch));
  absl::Status status = MeasureCopies(backend, options.bytes, rates);
  if (status.ok()) {
    status = MeasureWrites(backend, storage, scratch, options.bytes,
                           options.writer_streams, rates);
  }
  if (status.ok()) status = MeasureCommit(storage, scratch, rates);
  status.Update(storage.RemoveAll(scratch));
  if (!status.ok()) return status;
  return rates;
}

}  // namespace hoist
