// The host backend. Each logical device owns a FIFO of dispatches and
// `copy_engines` threads serving it. An engine claims the next piece of the
// dispatch at the head of the queue (an op, or a chunk of a large op), copies
// it without holding the lock, and the engine that finishes a dispatch's last
// piece completes its promise (so completion callbacks run on that engine).
#include "hoist/host_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/stream_copy.h"
#include "hoist/base/thread_priority.h"
#include "hoist/device/copy_op.h"
#include "hoist/huge_pages.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

constexpr int64_t kPageBytes = 4096;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Pinning holds the process's mmap lock while it faults pages in, so a
// large pool is pinned a chunk at a time: another thread's mmap (a restore
// allocating its arrays while the pool is pinned in the background) waits
// for one chunk, not for the whole pool.
constexpr int64_t kPinChunkBytes = int64_t{32} << 20;

// `bytes` (> 0) of fresh private anonymous memory, whole pages: its first
// byte and its size. `what` names it in errors: kInvalidArgument for a size
// <= 0, kResourceExhausted when mmap fails.
absl::StatusOr<std::pair<void*, int64_t>> MapFresh(int64_t bytes,
                                                   std::string_view what) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s allocation of %d bytes: size must be > 0", what, bytes));
  }
  const int64_t size = AlignUp(bytes, kPageBytes);
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mmap of %d bytes of %s memory failed: %s", size, what,
                        std::strerror(errno)));
  }
  return std::make_pair(data, size);
}

// Faults in every page of a fresh mapping (huge pages where advised).
void Populate(void* data, int64_t size) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t at = 0; at < size; at += kPinChunkBytes) {
    const int64_t chunk = std::min(kPinChunkBytes, size - at);
    if (madvise(bytes + at, chunk, MADV_POPULATE_WRITE) == 0) continue;
    auto* page = static_cast<volatile uint8_t*>(bytes + at);  // older kernels
    for (int64_t p = 0; p < chunk; p += kPageBytes) page[p] = 0;
  }
}

// mlock()s a fresh mapping a chunk at a time; false (nothing left locked)
// where the memlock limit refuses it.
bool Lock(void* data, int64_t size) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t at = 0; at < size; at += kPinChunkBytes) {
    if (mlock(bytes + at, std::min(kPinChunkBytes, size - at)) != 0) {
      if (at > 0) munlock(data, at);
      return false;
    }
  }
  return true;
}

// Ops checked and cut into pieces, ready to dispatch (once, or again and
// again when prepared).
struct HostCopies final : PreparedCopies {
  std::vector<CopyOp> ops;
  std::vector<int64_t> pieces;  // per op
  int64_t total_pieces = 0;
  int64_t bytes = 0;
};

struct Dispatch {
  std::shared_ptr<const HostCopies> copies;
  Promise<> promise;
  std::atomic<int64_t> remaining{0};  // pieces not yet copied
};

class HostDevice final : public Device {
 public:
  HostDevice(DeviceId id, const HostBackendOptions& options)
      : id_(id), chunk_bytes_(options.copy_chunk_bytes) {
    const HostBackendOptions::CopyPriority priority = options.copy_priority;
    for (int i = 0; i < options.copy_engines; ++i) {
      engines_.emplace_back([this, priority, i] {
        NameThisThread(absl::StrFormat("hoist-copy%d.%d", id_, i));
        // Advice: a system that refuses leaves the engine as it was.
        switch (priority) {
          case HostBackendOptions::CopyPriority::kNormal:
            break;
          case HostBackendOptions::CopyPriority::kBatch:
            MakeThisThreadBatch().IgnoreError();
            break;
          case HostBackendOptions::CopyPriority::kIdle:
            LowerThisThreadPriority(0, /*idle=*/true).IgnoreError();
            break;
        }
        EngineLoop();
      });
    }
  }

  ~HostDevice() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& engine : engines_) engine.join();
  }

  DeviceId id() const override { return id_; }

  void HoldCopies() override {
    MutexLock lock(&mu_);
    held_ = true;
  }
  void ReleaseCopies() override {
    MutexLock lock(&mu_);
    held_ = false;
  }

  Future<> CopyToHost(absl::Span<const CopyOp> ops) override {
    return Enqueue(ops);
  }
  Future<> CopyFromHost(absl::Span<const CopyOp> ops) override {
    return Enqueue(ops);
  }

  absl::StatusOr<std::shared_ptr<const PreparedCopies>> PrepareCopiesToHost(
      absl::Span<const CopyOp> ops) override {
    return Prepare(ops);
  }
  Future<> CopyPreparedToHost(
      std::shared_ptr<const PreparedCopies> copies) override {
    return Enqueue(std::static_pointer_cast<const HostCopies>(copies));
  }

  absl::StatusOr<MemoryBlock> Allocate(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("device %d: cannot allocate %d bytes", id_, bytes));
    }
    const int64_t size =
        std::max<int64_t>(AlignUp(bytes, kPageBytes), kPageBytes);
    // Device memory is resident from the start (as on an accelerator): map
    // it, ask for huge pages where they pay (hoist/huge_pages.h), and
    // populate it now, so no copy into it pays page faults.
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("device %d: out of memory allocating %d bytes: %s",
                          id_, bytes, std::strerror(errno)));
    }
    AdviseHugePagesFor(data, size);
    Populate(data, size);
    return MemoryBlock(data, bytes,
                       [size](void* p, int64_t) { munmap(p, size); });
  }

  DeviceCounters counters() const override { return counters_.Snapshot(); }

 private:
  absl::StatusOr<std::shared_ptr<const HostCopies>> Prepare(
      absl::Span<const CopyOp> ops) const {
    absl::StatusOr<std::vector<CopyOp>> normalized = NormalizeCopyOps(ops);
    if (!normalized.ok()) {
      return absl::Status(
          normalized.status().code(),
          absl::StrFormat("device %d: %s", id_, normalized.status().message()));
    }
    auto copies = std::make_shared<HostCopies>();
    copies->ops = *std::move(normalized);
    // One pass: each op's pieces, and the bytes for the counters.
    copies->pieces.resize(copies->ops.size());
    for (size_t i = 0; i < copies->ops.size(); ++i) {
      const CopyOp& op = copies->ops[i];
      copies->pieces[i] = PiecesOf(op);
      copies->total_pieces += copies->pieces[i];
      copies->bytes += op.bytes();
    }
    return copies;
  }

  Future<> Enqueue(absl::Span<const CopyOp> ops) {
    absl::StatusOr<std::shared_ptr<const HostCopies>> copies = Prepare(ops);
    if (!copies.ok()) return Future<>::Ready(copies.status());
    return Enqueue(*std::move(copies));
  }

  Future<> Enqueue(std::shared_ptr<const HostCopies> copies) {
    if (copies->ops.empty()) return Future<>::Ready(absl::OkStatus());
    auto dispatch = std::make_shared<Dispatch>();
    dispatch->remaining.store(copies->total_pieces, std::memory_order_relaxed);
    counters_.AddDispatch(static_cast<int64_t>(copies->ops.size()),
                          copies->bytes);
    dispatch->copies = std::move(copies);
    Future<> future = dispatch->promise.future();
    {
      MutexLock lock(&mu_);
      queue_.push_back(std::move(dispatch));
    }
    return future;
  }

  // A contiguous op splits into byte chunks, a strided one into row groups.
  int64_t RowsPerPiece(const CopyOp& op) const {
    return std::max<int64_t>(1, chunk_bytes_ / op.width_bytes);
  }
  int64_t PiecesOf(const CopyOp& op) const {
    if (op.rows == 1) {
      // Most ops of a save are one piece: no division for them.
      if (op.width_bytes <= chunk_bytes_) return 1;
      return (op.width_bytes + chunk_bytes_ - 1) / chunk_bytes_;
    }
    const int64_t rows = RowsPerPiece(op);
    return (op.rows + rows - 1) / rows;
  }

  void CopyPiece(const CopyOp& op, int64_t piece) const {
    const auto* src = static_cast<const uint8_t*>(op.src);
    auto* dst = static_cast<uint8_t*>(op.dst);
    if (op.rows == 1) {
      const int64_t begin = piece * chunk_bytes_;
      const int64_t len = std::min(chunk_bytes_, op.width_bytes - begin);
      StreamCopy(dst + begin, src + begin, len);
      return;
    }
    const int64_t per = RowsPerPiece(op);
    const int64_t first = piece * per;
    const int64_t last = std::min(op.rows, first + per);
    StreamCopies rows;
    for (int64_t r = first; r < last; ++r) {
      rows.Copy(dst + r * op.dst_pitch, src + r * op.src_pitch, op.width_bytes);
    }
  }

  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (!queue_.empty() && !held_);
  }

  void EngineLoop() {
    while (true) {
      std::shared_ptr<Dispatch> dispatch;
      size_t op = 0;
      int64_t piece = 0;
      {
        MutexLock lock(&mu_);
        mu_.Await(Condition(this, &HostDevice::HasWorkOrStopping));
        if (queue_.empty()) return;  // stopping, and nothing left to copy
        dispatch = queue_.front();
        op = next_op_;
        piece = next_piece_;
        if (++next_piece_ == dispatch->copies->pieces[next_op_]) {
          next_piece_ = 0;
          if (++next_op_ == dispatch->copies->ops.size()) {
            next_op_ = 0;
            queue_.pop_front();
          }
        }
      }
      const absl::Time start = absl::Now();
      CopyPiece(dispatch->copies->ops[op], piece);
      counters_.AddBusy(absl::Now() - start);
      if (dispatch->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        dispatch->promise.Set(absl::OkStatus());
      }
    }
  }

  const DeviceId id_;
  const int64_t chunk_bytes_;
  Mutex mu_;
  std::deque<std::shared_ptr<Dispatch>> queue_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;  // HoldCopies
  // Claim cursor into queue_.front().
  size_t next_op_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_piece_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  AtomicDeviceCounters counters_;
  std::vector<std::thread> engines_;  // last: started after the state above
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const HostBackendOptions& options) {
    for (int i = 0; i < options.num_devices; ++i) {
      owned_.push_back(
          std::make_unique<HostDevice>(options.first_device_id + i, options));
      devices_.push_back(owned_.back().get());
    }
  }

  std::string_view name() const override { return "host"; }
  absl::Span<Device* const> devices() const override { return devices_; }

  absl::StatusOr<MemoryBlock> AllocatePinned(int64_t bytes) override {
    ASSIGN_OR_RETURN(auto mapped, MapFresh(bytes, "pinned"));
    // Not a structured binding: clang 14 cannot capture one.
    void* const data = mapped.first;
    const int64_t size = mapped.second;
    // Advice only, and even where huge pages cost more to fault in
    // (AdviseHugePagesForIo): the pool is faulted in once, and every save
    // and restore moves its bytes through it. In a VM whose host discards
    // freed memory, locking 1 GiB advised for huge pages took 4-9 s against
    // 0.5-0.65 s in small pages, but O_DIRECT transfers from huge pages are
    // larger requests: save_bench --bytes 2GiB saved at 0.71 and 0.81 of
    // the disk's write limit with them, 0.63 and 0.66 without, and restored
    // onto devices at 0.46 and 0.51 of the read limit against 0.35 and 0.45
    // (2026-12-03, alternated).
    AdviseHugePagesForIo(data, size);
    // mlock faults every page in and keeps it resident; where the memlock
    // limit refuses it, populate the pages instead so the first save pays no
    // page faults.
    const bool locked = Lock(data, size);
    if (!locked) Populate(data, size);
    return MemoryBlock(data, bytes, [size, locked](void* p, int64_t) {
      if (locked) munlock(p, size);
      munmap(p, size);
    });
  }

  // Pageable, neither locked nor populated: the first save that stages
  // into it faults its pages in, and they stay for the saves after it. Not
  // advised for huge pages, unlike the pool: their faults stall on
  // compaction in this project's VM, on the first save's blocked path (1 GiB
  // of NumPy arrays through a 256 MiB pool: 3.4 s blocked with the advice,
  // 0.26-0.27 s without; later saves 0.04 s either way, durable in
  // 0.39-0.41 s against 0.33 s, within this disk's drift, 2026-12-05).
  absl::StatusOr<MemoryBlock> AllocateOverflow(int64_t bytes) override {
    ASSIGN_OR_RETURN(auto mapped, MapFresh(bytes, "overflow"));
    // Not a structured binding: clang 14 cannot capture one.
    void* const data = mapped.first;
    const int64_t size = mapped.second;
    return MemoryBlock(data, bytes,
                       [size](void* p, int64_t) { munmap(p, size); });
  }

 private:
  std::vector<std::unique_ptr<HostDevice>> owned_;
  std::vector<Device*> devices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeHostBackend(
    const HostBackendOptions& options) {
  if (options.num_devices < 1 || options.copy_engines < 1 ||
      options.first_device_id < 0 || options.copy_chunk_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host backend options: num_devices (%d) and copy_engines (%d) must "
        "be >= 1, first_device_id (%d) >= 0, copy_chunk_bytes (%d) >= 4096",
        options.num_devices, options.copy_engines, options.first_device_id,
        options.copy_chunk_bytes));
  }
  return std::make_unique<HostBackend>(options);
}

}  // namespace hoist
