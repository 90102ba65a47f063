// Value types of the checkpoint API: what a restore fills and reports, and
// what a verification finds.
#ifndef HOIST_CHECKPOINT_TYPES_H_
#define HOIST_CHECKPOINT_TYPES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "hoist/array_spec.h"
#include "hoist/box.h"
#include "hoist/device.h"
#include "hoist/dtype.h"

namespace hoist {

// One box of an array to fill. Three kinds:
//   - device memory: `device` and `data` (the box's bytes, dense, C order);
//   - host memory: `data` only;
//   - a receiver's: neither (both null): the box is staged in host memory,
//     whole or in parts when it is larger than half the staging pool, and
//     each part is handed to the restore's RestoreReceiver, which places it
//     itself (how Python puts shards on JAX devices). `tag` is the caller's
//     name for the box, handed back with it.
struct RestoreDestination {
  Box box;
  Device* device = nullptr;
  void* data = nullptr;
  uint64_t tag = 0;
};

// A staged part of a receiver's destination box.
struct StagedPart {
  const RestoreDestination* destination = nullptr;  // whose box this is part of
  Box part;  // the part of destination->box these bytes hold (often all of it)
  int64_t offset_bytes = 0;  // where `part` starts in the box's dense bytes
  const uint8_t* bytes = nullptr;  // valid during the call only
  int64_t size_bytes = 0;
};

// Receives, once per wave of a restore, every staged part of the wave's
// receiver destinations, on the restoring thread. It must copy the bytes
// before it returns (the staging memory is reused); an error it returns
// fails the restore.
using RestoreReceiver =
    std::function<absl::Status(absl::Span<const StagedPart> parts)>;

struct RestoreTarget {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // must match the checkpoint's
  std::vector<RestoreDestination> destinations;
};

// Allocates 4 KiB-aligned memory: a restore reads extents straight into a
// destination whose bytes start so aligned (O_DIRECT), and copies them from
// a buffer into any other.
template <typename T>
struct PageAlignedAllocator {
  using value_type = T;
  static constexpr size_t kAlignment = 4096;
  PageAlignedAllocator() = default;
  template <typename U>
  PageAlignedAllocator(const PageAlignedAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(
        ::operator new(n * sizeof(T), std::align_val_t(kAlignment)));
  }
  void deallocate(T* p, size_t) {
    ::operator delete(p, std::align_val_t(kAlignment));
  }
  template <typename U>
  bool operator==(const PageAlignedAllocator<U>&) const {
    return true;
  }
};
using AlignedBytes = std::vector<uint8_t, PageAlignedAllocator<uint8_t>>;

// Every array of `specs` restored whole into host memory this object owns:
// targets[i] fills bytes[i] with array i, dense, in C order. The buffers are
// 4 KiB-aligned and zero-filled (so resident) when made.
struct HostArrays {
  std::vector<AlignedBytes> bytes;
  std::vector<RestoreTarget> targets;
};
HostArrays WholeArraysInHost(absl::Span<const ArraySpec> specs);

// Where a step lives: the durable root every process shares, or the local
// tier (CheckpointManagerOptions::local: parts on each process's own
// storage, replicated to peers).
enum class Tier { kDurable, kLocal };
// "durable", "local".
inline std::string_view TierName(Tier tier) {
  return tier == Tier::kLocal ? "local" : "durable";
}

struct RestoreOptions {
  int reader_threads = 8;  // extents read in parallel (default 8), >= 1
  // With a local tier, CheckpointManager::Restore restores the newest step
  // of either tier (default true); false reads the durable tier only, as
  // without one (and is not collective).
  bool local_tier = true;
  // Default true: every extent read is checked against its XXH3 and a
  // mismatch is kDataLoss. false exists only so bench/ can measure what
  // checking costs; nothing should restore unchecked.
  bool verify_xxh3 = true;
  // CheckpointManager::Restore, with the pool still to pin
  // (PoolPinning::kBackground): start pinning it when the restore returns
  // (default true: the job goes on to train, then save). false leaves that
  // to CheckpointManager::PinPool, for a caller with more to do first:
  // pinning faults in every page of the pool, and beside other work it
  // slows it (Python hands each restored JAX shard to its device after the
  // engine returns: 3.3x slower beside a 1.2 GiB pool being pinned).
  bool pin_pool_after = true;
};

struct RestoreStats {
  int64_t extents_read = 0;
  int64_t bytes_read = 0;
  // The bytes of the distinct boxes the targets asked for (replicas once):
  // bytes_read / target_bytes is the read amplification, 1.0 when every
  // extent read lies wholly inside what was asked for and is read once.
  int64_t target_bytes = 0;
  int64_t dispatches = 0;  // CopyFromHost calls
  int64_t waves = 0;
  absl::Duration elapsed;
  // CheckpointManager::Restore: the step restored, the tier it came from,
  // and, with a local tier, what was chosen and why (which replicas served
  // which ranks; why the durable tier was used).
  int64_t step = -1;
  Tier restored_from = Tier::kDurable;
  std::string note;
};

// Live byte counts of one save, updated as it runs (this process's share).
struct SaveProgress {
  std::atomic<int64_t> staged_bytes{0};   // in host memory
  std::atomic<int64_t> written_bytes{0};  // handed to storage
  int64_t total_bytes = 0;
  absl::Time start;  // when Save() accepted the save
};

struct VerifyReport {
  int64_t arrays = 0;
  int64_t extents = 0;                // extents checked
  int64_t bytes = 0;                  // bytes read
  std::vector<std::string> problems;  // every one found, not only the first
  bool ok() const { return problems.empty(); }
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_TYPES_H_
