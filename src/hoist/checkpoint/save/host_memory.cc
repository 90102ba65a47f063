#include "hoist/checkpoint/save/host_memory.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"

namespace hoist {

int64_t AvailableHostMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    // "MemAvailable:   23456789 kB"
    if (!line.starts_with("MemAvailable:")) continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (fields.size() >= 2 && absl::SimpleAtoi(fields[1], &kib)) {
      return kib * 1024;
    }
  }
  return 0;
}

absl::StatusOr<int64_t> HostMemoryBudgetBytes(int64_t budget_bytes,
                                              int64_t pool_bytes,
                                              Coordinator& coordinator) {
  if (budget_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host_memory_budget %d: give bytes (> 0) or 0 for auto", budget_bytes));
  }
  if (budget_bytes > 0) {
    if (budget_bytes < pool_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "host_memory_budget (%s) must hold the staging pool (pool_bytes "
          "%s): it bounds the pool and its overflow together",
          FormatBytes(static_cast<double>(budget_bytes)),
          FormatBytes(static_cast<double>(pool_bytes))));
    }
    return budget_bytes;
  }
  // Auto: this process's share of half of what the host has free.
  int processes_here = 1;
  if (coordinator.size() > 1) {
    const std::string mine = HostName();
    ASSIGN_OR_RETURN(std::vector<std::string> hosts,
                     coordinator.AllGather("host memory", mine));
    processes_here = static_cast<int>(absl::c_count(hosts, mine));
  }
  const int64_t share =
      AvailableHostMemoryBytes() / 2 / std::max(processes_here, 1);
  return std::max(share, pool_bytes);
}

int64_t OverflowBytesFor(const StagingLayout& layout, int64_t pool_bytes) {
  int64_t staged = 0;  // as leased: every group 4 KiB-aligned
  for (int64_t bytes : layout.group_bytes) staged += bytes;
  if (staged <= pool_bytes) return 0;
  return AlignUp(staged - pool_bytes + pool_bytes / 2, StagingPool::kAlignment);
}

std::string BlockedReason(const TransferStats& stats, int64_t pool_bytes,
                          int64_t budget_bytes) {
  if (stats.stalled_bytes == 0) return "";
  return absl::StrFormat(
      "%s of this process's %s waited for storage to free host memory: the "
      "staging pool (%s) and its overflow held the rest, within "
      "host_memory_budget %s; raise host_memory_budget to stage it all at "
      "the copies' speed",
      FormatBytes(static_cast<double>(stats.stalled_bytes)),
      FormatBytes(static_cast<double>(stats.bytes)),
      FormatBytes(static_cast<double>(pool_bytes)),
      FormatBytes(static_cast<double>(budget_bytes)));
}

StagingPool* StagingOverflow::Reserve(int64_t bytes, int64_t cap) {
  cap = std::min(cap, limit_bytes_);
  bytes = std::min(bytes, cap);
  if (pool_ != nullptr &&
      pool_->capacity_bytes() > AlignUp(cap, StagingPool::kAlignment)) {
    pool_.reset();
  }
  if (bytes <= 0) return nullptr;
  if (pool_ != nullptr && pool_->capacity_bytes() >= bytes) return pool_.get();
  pool_.reset();  // freed before its successor is had
  absl::StatusOr<std::unique_ptr<StagingPool>> pool =
      StagingPool::CreatePending(bytes);
  if (!pool.ok()) {
    last_error_ = pool.status();
    return nullptr;
  }
  absl::StatusOr<MemoryBlock> memory =
      backend_.AllocateOverflow((*pool)->capacity_bytes());
  last_error_ = memory.status();
  if (!memory.ok()) return nullptr;
  (*pool)->Provide(*std::move(memory));
  pool_ = *std::move(pool);
  return pool_.get();
}

}  // namespace hoist
