// StagingPool: the fixed region of pinned host memory that device copies
// land in. Allocated once (through the Backend), when the pool is created or
// by its owner soon after (CreatePending), and reused by every save; nothing
// on the save path allocates pinned memory.
#ifndef HOIST_TRANSFER_STAGING_POOL_H_
#define HOIST_TRANSFER_STAGING_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/device.h"
#include "hoist/mutex.h"

namespace hoist {

class StagingPool;

// Exclusive use of a 4 KiB-aligned range of a StagingPool. Move-only; the
// range returns to the pool when the lease is destroyed or Release()d. A
// lease must not outlive its pool.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept { *this = std::move(other); }
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { Release(); }

  // The first byte; 4 KiB-aligned. Null for an empty (released) lease.
  uint8_t* data() const { return data_; }
  // The bytes asked for (the range reserved may be larger, up to 4 KiB).
  int64_t size_bytes() const { return size_bytes_; }
  // The bytes reserved: size_bytes() rounded up to 4 KiB. All of them may be
  // written, e.g. to pad an extent to a whole O_DIRECT block.
  int64_t reserved_bytes() const { return reserved_bytes_; }
  explicit operator bool() const { return pool_ != nullptr; }

  // Returns the range to the pool now. Idempotent.
  void Release();

  // Splits off the first `size_bytes` (> 0), rounded up to 4 KiB and at
  // most reserved_bytes(), as a lease of their own, returned to the pool
  // when it is; this lease keeps the rest (all of it usable: size_bytes()
  // == reserved_bytes()), and is empty once nothing is left. One lease for
  // many ranges is acquired in one step and handed on range by range.
  Lease TakeFront(int64_t size_bytes);

 private:
  friend class StagingPool;
  StagingPool* pool_ = nullptr;
  uint8_t* data_ = nullptr;
  int64_t offset_ = 0;
  int64_t reserved_bytes_ = 0;
  int64_t size_bytes_ = 0;
};

struct StagingPoolStats {
  int64_t capacity_bytes = 0;
  int64_t in_use_bytes = 0;  // reserved by live leases now
  int64_t peak_bytes = 0;    // the most ever reserved at once
  int64_t leases = 0;        // leases handed out
  int64_t waits = 0;         // acquisitions that had to wait for space
};

// Thread-safe. Must outlive its leases.
class StagingPool {
 public:
  // Every lease starts at a multiple of this (hoist/device.h).
  static constexpr int64_t kAlignment = kPoolAlignmentBytes;

  // Allocates `capacity_bytes` (> 0, rounded up to 4 KiB) of pinned memory
  // from `backend` once. Errors are those of Backend::AllocatePinned.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(
      Backend& backend, int64_t capacity_bytes);

  // A pool of `capacity_bytes` (> 0) whose memory comes later, through
  // Provide(): pinning a large pool takes time (faulting in every page), so
  // its owner may do it on a thread of its own while the pool's first user
  // (often a restore into memory it does not need) goes ahead. Acquisitions
  // wait until the memory is provided.
  static absl::StatusOr<std::unique_ptr<StagingPool>> CreatePending(
      int64_t capacity_bytes);
  // Hands a pending pool its memory (at least capacity_bytes()), or the
  // error that allocating it returned, which every acquisition then
  // returns. Once only.
  void Provide(absl::StatusOr<MemoryBlock> memory) ABSL_LOCKS_EXCLUDED(mu_);

  ~StagingPool();

  int64_t capacity_bytes() const { return capacity_bytes_; }

  // Reserves one lease per entry of `sizes`, all at once or none: blocks
  // (backpressure) until every one fits, so a caller never holds part of a
  // batch while waiting for the rest. Errors: kInvalidArgument for a size
  // <= 0; kResourceExhausted when the batch, 4 KiB-aligned, exceeds the
  // capacity and so can never fit; kDeadlineExceeded after `timeout`; the
  // allocation's error for a pending pool whose memory failed. An empty
  // batch returns at once, also from a pending pool.
  absl::StatusOr<std::vector<Lease>> AcquireAll(
      absl::Span<const int64_t> sizes,
      absl::Duration timeout = absl::InfiniteDuration());

  // AcquireAll, now or never: waits only for a pending pool's memory (it
  // is coming at memory speed), then places the batch at once or returns
  // nullopt, reserving nothing. Errors: as AcquireAll's.
  absl::StatusOr<std::optional<std::vector<Lease>>> TryAcquireAll(
      absl::Span<const int64_t> sizes);

  // One lease; as AcquireAll.
  absl::StatusOr<Lease> Acquire(
      int64_t bytes, absl::Duration timeout = absl::InfiniteDuration());

  // One lease of the pool's first `bytes` (> 0, rounded up to 4 KiB), now
  // or never: nullopt while any of them is leased, or the memory is still
  // to come. What stays free beside it is then one range, so any batch that
  // fits in the rest can always be placed once the other leases return: a
  // restore's readers hold their buffers this way while its waves come and
  // go.
  std::optional<Lease> TryAcquireFront(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  StagingPoolStats stats() const;

  // Restarts peak tracking from the bytes in use now (per-save peaks).
  void ResetPeak();

 private:
  explicit StagingPool(int64_t capacity_bytes);

  // Places every size (they sum to `total`) in the free list and returns
  // their offsets, or nullopt if they do not all fit now: one after the
  // other in the first block that holds them all, else first fit, largest
  // first.
  std::optional<std::vector<int64_t>> TryPlace(
      absl::Span<const int64_t> reserved, int64_t total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Free(int64_t offset, int64_t reserved) ABSL_LOCKS_EXCLUDED(mu_);
  // Each size rounded up to kAlignment, and their sum; kInvalidArgument
  // and kResourceExhausted as AcquireAll.
  absl::StatusOr<std::pair<std::vector<int64_t>, int64_t>> Reserved(
      absl::Span<const int64_t> sizes) const;
  // Waits until the memory is provided (or `deadline`) and returns its
  // status.
  absl::Status AwaitMemory(absl::Time deadline, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The leases at `offsets` of the memory, one per size.
  std::vector<Lease> LeasesAt(absl::Span<const int64_t> sizes,
                              absl::Span<const int64_t> reserved,
                              absl::Span<const int64_t> offsets, uint8_t* base);
  // Counts `leases` new leases of `reserved` bytes in all in the stats.
  void Count(int64_t reserved, int64_t leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A lease of the range at `offset` of the pool's memory `base`.
  Lease LeaseAt(uint8_t* base, int64_t offset, int64_t reserved, int64_t size);

  friend class Lease;

  const int64_t capacity_bytes_;
  mutable Mutex mu_;
  CondVar freed_;  // also signalled when the memory is provided
  // Set once, by Create or Provide; null data until then.
  MemoryBlock memory_ ABSL_GUARDED_BY(mu_);
  absl::Status memory_status_ ABSL_GUARDED_BY(mu_);
  bool provided_ ABSL_GUARDED_BY(mu_) = false;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> bytes
  StagingPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_TRANSFER_STAGING_POOL_H_
