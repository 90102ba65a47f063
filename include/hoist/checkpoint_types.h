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
#include "hoist/mutex.h"

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

// Host memory for one restored array, untouched until written (so its
// first touch is the restore's). A restore reads extents straight into a
// destination whose bytes start 4 KiB-aligned (O_DIRECT), and copies them
// from a buffer into any other: this memory is 4 KiB-aligned, and from 2 MiB
// on 2 MiB-aligned with its whole 2 MiB blocks advised for transparent huge
// pages (MADV_HUGEPAGE), which where the kernel grants them cut the page
// faults 512-fold and speed direct reads; not in a VM whose host discards
// freed memory, where they cost more (hoist/huge_pages.h).
// Move-only; throws std::bad_alloc when the memory cannot be mapped, as a
// vector would.
class HostBuffer {
 public:
  explicit HostBuffer(int64_t bytes);
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  ~HostBuffer();
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  absl::Span<const uint8_t> span() const {
    return {data_, static_cast<size_t>(size_)};
  }

 private:
  void* mapping_ = nullptr;
  int64_t mapped_ = 0;
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Every array of `specs` restored whole into host memory this object owns:
// targets[i] fills bytes[i] with array i, dense, in C order.
struct HostArrays {
  std::vector<HostBuffer> bytes;
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

// One phase of a save or a restore on one rank: its wall time and the bytes
// it moved (docs/observability.md names each). A save's phases, and a
// restore's, follow one another: their times add up to its whole time on
// that rank.
struct PhaseStat {
  std::string phase;  // "planning", "staging", "write", ...
  absl::Duration elapsed;
  int64_t bytes = 0;
  int rank = 0;  // the rank that measured it
};

// One save's or restore's phases on this rank, with the job's slowest rank
// per phase where known (CheckpointManagerOptions::on_phases).
struct PhaseReport {
  std::string kind;  // "save" or "restore"
  int64_t step = 0;
  Tier tier = Tier::kDurable;
  absl::Duration elapsed;  // the whole save or restore on this rank
  std::vector<PhaseStat> phases;
  std::vector<PhaseStat> slowest;
};

struct OperationProgress;

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
  // Default true: threads of the restore fault in host destinations ahead
  // of the reads that fill them (src/hoist/checkpoint/prefault.h), cheaper
  // than faulting them inside the reads. false exists only so bench/ can
  // measure what that saves.
  bool prefault = true;
  // Default true: extents bound for host memory are read into a reader's
  // buffer (huge pages, reused for every read) and copied into place, not
  // read straight into the destination. A direct read into small pages is
  // hundreds of 4 KiB segments for the device: on this project's VM it ran
  // at 0.55-0.6 of the same read into huge pages, resident or not, and the
  // copy costs less than that (restore of 2 GiB into new memory:
  // bench/results/save-bench-2026-12-03.txt). false reads straight into a
  // 4 KiB-aligned destination, sparing the copy, which may pay where the
  // destination is huge pages already or the device takes small segments
  // as fast; bench/ measures both.
  bool stage_host_reads = true;
  // CheckpointManager::Restore, with the pool still to pin
  // (PoolPinning::kBackground): start pinning it when the restore returns,
  // so that the first save after it finds the pool ready. Default false:
  // the pool is pinned by the first save (or CheckpointManager::PinPool),
  // so that a restore holds no memory it does not use (a 1 GiB pool pinned
  // after a 2 GiB restore took the process's peak memory from 1.08x the
  // state to 1.52x), and nothing faults in pages beside the work that
  // follows a restore (Python hands each restored JAX shard to its device
  // after the engine returns: 3.3x slower beside a 1.2 GiB pool being
  // pinned). The first save then waits for the pool: about 0.5 s per GiB
  // on this project's VM.
  bool pin_pool_after = false;
  // Counts the bytes read from storage (their total once planned), for a
  // progress bar, when set. Default none.
  OperationProgress* progress = nullptr;
  // CheckpointManager::Restore of a durable step in a job of several
  // processes is collective (every rank restores the same step, each its
  // own targets) unless kNever. With shared reads, a saved extent that
  // several ranks need (data-parallel replicas restoring the same boxes) is
  // read from storage by one of them and sent to the others through the
  // coordinator's Exchange: the job reads each byte once, holding at most
  // half the pool's size of such extents at a time. kAuto (the default)
  // shares when the root is on an object store or the job spans several
  // hosts (a root they all read is shared storage); on one host with a
  // local root each rank reads for itself, which was faster here (a page
  // cache or a local disk serves a read in one copy; a shared extent takes
  // several). kAlways shares regardless; kNever never (and is not
  // collective).
  enum class SharedReads { kAuto, kAlways, kNever };
  SharedReads shared_reads = SharedReads::kAuto;
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
  // With a local tier: the bytes of parts this process got from peers (a
  // part it had lost), not read from storage.
  int64_t bytes_received = 0;
  // This rank's phases, in order: planning, read, verify, place
  // (docs/observability.md); they add up to `elapsed`.
  std::vector<PhaseStat> phases;
};

// Text one thread sets and others read: what an operation is doing.
class SharedText {
 public:
  void Set(std::string_view text) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (text_ != text) text_.assign(text);
  }
  std::string Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return text_;
  }

 private:
  mutable Mutex mu_;
  std::string text_ ABSL_GUARDED_BY(mu_);  // "" until set
};

// Live byte counts of one save, updated as it runs (this process's share).
struct SaveProgress {
  std::atomic<int64_t> staged_bytes{0};   // in host memory
  std::atomic<int64_t> written_bytes{0};  // handed to storage
  // Staged bytes that waited for storage to free host memory (the save
  // exceeded CheckpointManagerOptions::host_memory_budget); set once the
  // save is staged.
  std::atomic<int64_t> stalled_bytes{0};
  int64_t total_bytes = 0;
  absl::Time start;  // when Save() accepted the save
  // The phase under way (a string literal: "staging", "write", ...) and
  // the file or object last written: what a stalled save's warning names
  // (CheckpointManagerOptions::stall_warn).
  std::atomic<const char*> phase{"planning"};
  SharedText writing;
};

// Live progress of a long operation (a verification, a restore, an export,
// an import, a removal), for a progress bar: the operation's threads add to
// it, any thread reads it.
struct OperationProgress {
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> total{0};  // 0 until known
  bool bytes = true;              // counts bytes; else items (steps)
  SharedText current;             // the array, file or step under way
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
