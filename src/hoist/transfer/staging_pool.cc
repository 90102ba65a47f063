#include "hoist/transfer/staging_pool.h"

#include <algorithm>
#include <cassert>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"

namespace hoist {

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    offset_ = other.offset_;
    reserved_bytes_ = other.reserved_bytes_;
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void Lease::Release() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Free(offset_, reserved_bytes_);
  data_ = nullptr;
  size_bytes_ = 0;
}

Lease Lease::TakeFront(int64_t size_bytes) {
  const int64_t reserved =
      std::min(AlignUp(size_bytes, StagingPool::kAlignment), reserved_bytes_);
  assert(pool_ != nullptr && size_bytes > 0);
  Lease front;
  front.pool_ = pool_;
  front.data_ = data_;
  front.offset_ = offset_;
  front.reserved_bytes_ = reserved;
  front.size_bytes_ = std::min(size_bytes, reserved);
  data_ += reserved;
  offset_ += reserved;
  reserved_bytes_ -= reserved;
  size_bytes_ = reserved_bytes_;
  if (reserved_bytes_ == 0) {
    pool_ = nullptr;
    data_ = nullptr;
  }
  return front;
}

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(
    Backend& backend, int64_t capacity_bytes) {
  if (capacity_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging pool capacity must be > 0, got %d", capacity_bytes));
  }
  const int64_t capacity = AlignUp(capacity_bytes, kAlignment);
  absl::StatusOr<MemoryBlock> memory = backend.AllocatePinned(capacity);
  if (!memory.ok()) return memory.status();
  std::unique_ptr<StagingPool> pool(new StagingPool(capacity));
  pool->Provide(*std::move(memory));
  return pool;
}

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::CreatePending(
    int64_t capacity_bytes) {
  if (capacity_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging pool capacity must be > 0, got %d", capacity_bytes));
  }
  return std::unique_ptr<StagingPool>(
      new StagingPool(AlignUp(capacity_bytes, kAlignment)));
}

StagingPool::StagingPool(int64_t capacity_bytes)
    : capacity_bytes_(capacity_bytes) {
  MutexLock lock(&mu_);
  free_.emplace(0, capacity_bytes_);
  stats_.capacity_bytes = capacity_bytes_;
}

void StagingPool::Provide(absl::StatusOr<MemoryBlock> memory) {
  {
    MutexLock lock(&mu_);
    assert(!provided_ && "StagingPool::Provide called twice");
    provided_ = true;
    if (!memory.ok()) {
      memory_status_ = memory.status();
    } else if (memory->size_bytes() < capacity_bytes_) {
      memory_status_ = absl::InternalError(
          absl::StrFormat("staging pool of %d bytes was given only %d",
                          capacity_bytes_, memory->size_bytes()));
    } else {
      memory_ = *std::move(memory);
    }
  }
  freed_.SignalAll();
}

StagingPool::~StagingPool() {
  MutexLock lock(&mu_);
  assert(stats_.in_use_bytes == 0 && "a Lease outlived its StagingPool");
}

std::optional<std::vector<int64_t>> StagingPool::TryPlace(
    absl::Span<const int64_t> reserved, int64_t total) {
  // A free block that holds them all takes them one after the other: one
  // change to the free list however many leases (a save's first wave on the
  // caller's thread asks for thousands at once, usually of an empty pool).
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < total) continue;
    std::vector<int64_t> offsets(reserved.size());
    int64_t at = it->first;
    for (size_t i = 0; i < reserved.size(); ++i) {
      offsets[i] = at;
      at += reserved[i];
    }
    const int64_t rest = it->second - total;
    free_.erase(it);
    if (rest > 0) free_.emplace(at, rest);
    return offsets;
  }
  // Else largest first, each into the first block it fits.
  std::vector<size_t> order(reserved.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reserved[a] > reserved[b];
  });
  std::map<int64_t, int64_t> free = free_;  // trial copy; committed on success
  std::vector<int64_t> offsets(reserved.size());
  for (size_t i : order) {
    auto it = std::find_if(free.begin(), free.end(), [&](const auto& block) {
      return block.second >= reserved[i];
    });
    if (it == free.end()) return std::nullopt;
    offsets[i] = it->first;
    const int64_t rest = it->second - reserved[i];
    const int64_t rest_offset = it->first + reserved[i];
    free.erase(it);
    if (rest > 0) free.emplace(rest_offset, rest);
  }
  free_ = std::move(free);
  return offsets;
}

absl::StatusOr<std::pair<std::vector<int64_t>, int64_t>> StagingPool::Reserved(
    absl::Span<const int64_t> sizes) const {
  std::vector<int64_t> reserved(sizes.size());
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "staging lease %d of %d asks for %d bytes; sizes must be > 0", i,
          sizes.size(), sizes[i]));
    }
    reserved[i] = AlignUp(sizes[i], kAlignment);
    total += reserved[i];
    if (total > capacity_bytes_) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "staging request of %s (%d leases, 4 KiB-aligned) can never fit in "
          "the %s staging pool; raise the pool capacity",
          FormatBytes(static_cast<double>(total)), sizes.size(),
          FormatBytes(static_cast<double>(capacity_bytes_))));
    }
  }
  return std::make_pair(std::move(reserved), total);
}

absl::Status StagingPool::AwaitMemory(absl::Time deadline,
                                      absl::Duration timeout) {
  while (!provided_) {
    if (freed_.WaitWithDeadline(&mu_, deadline) && !provided_) {
      return absl::DeadlineExceededError(
          absl::StrFormat("the staging pool's memory was not ready after %s",
                          absl::FormatDuration(timeout)));
    }
  }
  return memory_status_;
}

std::vector<Lease> StagingPool::LeasesAt(absl::Span<const int64_t> sizes,
                                         absl::Span<const int64_t> reserved,
                                         absl::Span<const int64_t> offsets,
                                         uint8_t* base) {
  std::vector<Lease> leases;
  leases.reserve(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    leases.push_back(LeaseAt(base, offsets[i], reserved[i], sizes[i]));
  }
  return leases;
}

absl::StatusOr<std::vector<Lease>> StagingPool::AcquireAll(
    absl::Span<const int64_t> sizes, absl::Duration timeout) {
  ASSIGN_OR_RETURN(auto reserved_total, Reserved(sizes));
  const auto& [reserved, total] = reserved_total;
  if (sizes.empty()) return std::vector<Lease>();  // even before Provide
  const absl::Time deadline = absl::Now() + timeout;
  std::optional<std::vector<int64_t>> offsets;
  uint8_t* base = nullptr;
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitMemory(deadline, timeout));
    base = static_cast<uint8_t*>(memory_.data());
    offsets = TryPlace(reserved, total);
    if (!offsets) ++stats_.waits;
    while (!offsets) {
      const bool timed_out = freed_.WaitWithDeadline(&mu_, deadline);
      offsets = TryPlace(reserved, total);
      if (!offsets && timed_out) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "no room for %s in the staging pool after %s (%s in use)",
            FormatBytes(static_cast<double>(total)),
            absl::FormatDuration(timeout),
            FormatBytes(static_cast<double>(stats_.in_use_bytes))));
      }
    }
    Count(total, static_cast<int64_t>(sizes.size()));
  }
  return LeasesAt(sizes, reserved, *offsets, base);
}

absl::StatusOr<std::optional<std::vector<Lease>>> StagingPool::TryAcquireAll(
    absl::Span<const int64_t> sizes) {
  ASSIGN_OR_RETURN(auto reserved_total, Reserved(sizes));
  const auto& [reserved, total] = reserved_total;
  if (sizes.empty()) return std::vector<Lease>();
  std::optional<std::vector<int64_t>> offsets;
  uint8_t* base = nullptr;
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(
        AwaitMemory(absl::InfiniteFuture(), absl::InfiniteDuration()));
    base = static_cast<uint8_t*>(memory_.data());
    offsets = TryPlace(reserved, total);
    if (!offsets) return std::nullopt;
    Count(total, static_cast<int64_t>(sizes.size()));
  }
  return LeasesAt(sizes, reserved, *offsets, base);
}

void StagingPool::Count(int64_t reserved, int64_t leases) {
  stats_.in_use_bytes += reserved;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
  stats_.leases += leases;
}

Lease StagingPool::LeaseAt(uint8_t* base, int64_t offset, int64_t reserved,
                           int64_t size) {
  Lease lease;
  lease.pool_ = this;
  lease.data_ = base + offset;
  lease.offset_ = offset;
  lease.reserved_bytes_ = reserved;
  lease.size_bytes_ = size;
  return lease;
}

std::optional<Lease> StagingPool::TryAcquireFront(int64_t bytes) {
  if (bytes <= 0) return std::nullopt;
  const int64_t reserved = AlignUp(bytes, kAlignment);
  MutexLock lock(&mu_);
  if (!provided_ || !memory_status_.ok() || free_.empty() ||
      free_.begin()->first != 0 || free_.begin()->second < reserved) {
    return std::nullopt;
  }
  // The free block at offset 0 is the first that holds it: TryPlace takes
  // it there.
  const int64_t reserved_sizes[] = {reserved};
  const int64_t offset = TryPlace(reserved_sizes, reserved)->front();
  Count(reserved, 1);
  return LeaseAt(static_cast<uint8_t*>(memory_.data()), offset, reserved,
                 bytes);
}

absl::StatusOr<Lease> StagingPool::Acquire(int64_t bytes,
                                           absl::Duration timeout) {
  absl::StatusOr<std::vector<Lease>> leases = AcquireAll({bytes}, timeout);
  if (!leases.ok()) return leases.status();
  return std::move(leases->front());
}

void StagingPool::Free(int64_t offset, int64_t reserved) {
  {
    MutexLock lock(&mu_);
    auto [it, inserted] = free_.emplace(offset, reserved);
    assert(inserted);
    // Coalesce with the following and the preceding free block.
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
    stats_.in_use_bytes -= reserved;
  }
  freed_.SignalAll();
}

StagingPoolStats StagingPool::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void StagingPool::ResetPeak() {
  MutexLock lock(&mu_);
  stats_.peak_bytes = stats_.in_use_bytes;
}

}  // namespace hoist
