// The host memory a save may hold: the pinned staging pool, and beside it
// the overflow, where the waves of a save larger than the pool are staged
// so that the training loop waits for the copies, not for storage. Both
// together stay within CheckpointManagerOptions::host_memory_budget.
#ifndef HOIST_CHECKPOINT_SAVE_HOST_MEMORY_H_
#define HOIST_CHECKPOINT_SAVE_HOST_MEMORY_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hoist/coordinator.h"
#include "hoist/device.h"
#include "hoist/transfer/staging_pool.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

// The budget in bytes: `budget_bytes` when > 0 (kInvalidArgument when it is
// smaller than `pool_bytes`: the pool is part of it), else (auto) half the
// memory the system reports available now (MemAvailable), split evenly
// among the job's processes on this host (an all-gather of host names over
// `coordinator`), and never less than `pool_bytes`. Errors: the
// coordinator's; kInvalidArgument for a negative budget.
absl::StatusOr<int64_t> HostMemoryBudgetBytes(int64_t budget_bytes,
                                              int64_t pool_bytes,
                                              Coordinator& coordinator);

// The memory the system reports available (/proc/meminfo's MemAvailable),
// 0 when it cannot be read.
int64_t AvailableHostMemoryBytes();

// The overflow memory a share laid out as `layout` needs beside a pool of
// `pool_bytes` to be staged without waiting for storage: what the pool does
// not hold, plus half a pool (a wave) for the pool's last wave, which may
// end short of it. 0 when the pool holds the share.
int64_t OverflowBytesFor(const StagingLayout& layout, int64_t pool_bytes);

// Why a save's staging waited for storage ("" when it did not): the bytes
// that waited, the save's, and the setting that bounds them.
std::string BlockedReason(const TransferStats& stats, int64_t pool_bytes,
                          int64_t budget_bytes);

// The overflow of one staging pool: host memory from the backend
// (Backend::AllocateOverflow), grown to what the saves need and at most
// `limit_bytes`, kept from one save to the next (its pages stay faulted in)
// and freed with this object. Thread-compatible: Reserve only while no
// staging uses the pool it returned before.
class StagingOverflow {
 public:
  StagingOverflow(Backend& backend, int64_t limit_bytes)
      : backend_(backend), limit_bytes_(limit_bytes) {}

  int64_t limit_bytes() const { return limit_bytes_; }

  // The overflow, holding at least min(bytes, cap): the one there is when
  // it holds that much and no more than `cap`, else a new one of that size
  // (the old one freed first). `cap`: at most limit_bytes() (default).
  // Null when nothing is needed (bytes <= 0), nothing is allowed (cap <=
  // 0), or the backend could not allocate it (that error is kept in
  // last_error(); staging then waits for storage).
  StagingPool* Reserve(int64_t bytes,
                       int64_t cap = std::numeric_limits<int64_t>::max());

  // The last allocation's error (OK when it succeeded).
  const absl::Status& last_error() const { return last_error_; }

 private:
  Backend& backend_;
  const int64_t limit_bytes_;
  std::unique_ptr<StagingPool> pool_;
  absl::Status last_error_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_HOST_MEMORY_H_
