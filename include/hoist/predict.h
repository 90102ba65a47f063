// What a save will cost, before it runs: how long the training loop is
// blocked and how long until the step is durable, from the save's plan and
// the rates of the machines it runs on, measured here (MeasureSaveRates) or
// given for a cluster that is not this one (`hoist plan --predict`).
//
// The model (docs/prediction.md says where it is wrong). For each process p,
// with B_p the bytes it saves and B_d those its device d copies:
//   copy_p    = max(max_d B_d / d2h_gbps, B_p / host_gbps)
//   write_p   = B_p / write_gbps
//   overhead  = dispatches * dispatch_s + slices_p * per_slice_s
//   blocked_p = overhead + copy_p, plus, when B_p exceeds what a save may
//               hold in host memory (M: the pool and its overflow, see
//               CheckpointManagerOptions::host_memory_budget), the excess
//               written first: (B_p - M) / write_gbps
//   save_p    = overhead + copy_p / waves + max(copy_p - copy_p / waves,
//               write_p), with waves = B_p / pool rounded up: a device's
//               extents reach the writers when its whole dispatch has
//               landed, so the first wave's copies come before any write,
//               and the later waves' copies run beside the writes
// and for the job, whose step commits once every process has written:
//   blocked_s = max_p blocked_p
//   save_s    = max(max_p save_p, total bytes / fs_gbps) + commit_s
// A save is assumed to start with no other save in flight.
#ifndef HOIST_PREDICT_H_
#define HOIST_PREDICT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "hoist/array_spec.h"
#include "hoist/device.h"
#include "hoist/save_plan.h"
#include "hoist/storage.h"

namespace hoist {

// Rates in GB/s (1e9 bytes per second) and times in seconds.
struct SaveRates {
  // One device copying into pinned host memory, alone.
  double d2h_gbps = 0;
  // Every device of a process copying at once, summed (PCIe switches, host
  // memory). 0: d2h_gbps times the process's devices.
  double host_gbps = 0;
  // One process's writer streams to the checkpoint's storage, hashing
  // included, until the data is synced.
  double write_gbps = 0;
  // The filesystem every process writes to, all of them together (a shared
  // filesystem's aggregate). 0: no job-wide limit.
  double fs_gbps = 0;
  // The training thread's cost per copy dispatch and per slice (building
  // the ops, leasing pool memory).
  double dispatch_s = 20e-6;
  double per_slice_s = 2e-6;
  // After the last byte: the manifest, its sync, the rename, the barrier.
  double commit_s = 0.01;
};

struct SavePrediction {
  double blocked_s =
      0;              // a save that returns once staged (ReturnWhen::kStaged)
  double save_s = 0;  // until the step is committed
  // The process that takes longest, and what bounds it.
  int slowest_process = 0;
  double copy_s = 0;
  double write_s = 0;
  int64_t process_bytes = 0;  // the slowest process's
  int64_t device_bytes = 0;   // its busiest device's
  int64_t waves = 0;          // pool-sized rounds of copies it needs
  // What bounds save_s: "copy", "write" or "filesystem"; blocked_s: "copy",
  // or "pool" / "budget" (staging waits for writes to free host memory:
  // without an overflow / with one, the state exceeding the budget).
  std::string save_bound;
  std::string blocked_bound;
};

// `host_memory_bytes`: what a save may hold in host memory, the pool
// included (the manager's resolved host_memory_budget); 0 (or less than
// the pool): the pool alone. kInvalidArgument for rates that are not
// positive (d2h_gbps, write_gbps), negative ones, a pool_bytes < 1, or a
// plan whose slices belong to a process the topology lacks.
absl::StatusOr<SavePrediction> PredictSave(const SavePlan& plan,
                                           const Topology& topology,
                                           int64_t pool_bytes,
                                           const SaveRates& rates,
                                           int64_t host_memory_bytes = 0);

struct MeasureRatesOptions {
  // Bytes copied (split over the devices) and written per measurement; a
  // few hundred MiB gets past caches without taking long.
  int64_t bytes = int64_t{256} << 20;
  // The save's writer streams (SavePlanOptions::writer_streams).
  int writer_streams = 1;
};

// Measures this process's rates: device-to-host copies through `backend`
// (one device alone, then all at once) and writes through `storage` with the
// save's writer streams (2 threads per stream, 16 MiB writes of whole 4 KiB
// blocks, each hashed with XXH3 first, then synced), plus a commit's syncs
// and rename, in a new directory under `dir` that it removes. The
// per-dispatch and per-slice costs keep their defaults; fs_gbps stays 0.
// Errors: as the backend's and the storage's.
absl::StatusOr<SaveRates> MeasureSaveRates(
    Backend& backend, Storage& storage, const std::string& dir,
    const MeasureRatesOptions& options = {});

}  // namespace hoist

#endif  // HOIST_PREDICT_H_
