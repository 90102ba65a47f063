// The simulator's memory (device allocations, pinned and registered host
// memory), which queued operation uses which bytes, and the copies and sets
// that queue them (see sim_runtime.h). Bytes move row by row (Piece), so a
// strided copy is modelled as the driver sees it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "absl/strings/str_format.h"
#include "testing/cuda_sim/sim_runtime.h"

namespace hoist::cuda_sim::internal {
namespace {

bool Overlaps(uintptr_t begin, uintptr_t end, uintptr_t other_begin,
              uintptr_t other_end) {
  return begin < other_end && other_begin < end;
}

void FillRows(const Piece& piece, uint8_t byte) {
  for (size_t row = 0; row < piece.rows; ++row) {
    std::memset(piece.dst + row * piece.dst_pitch, byte, piece.width);
  }
}

std::string Range(uintptr_t begin, uintptr_t end) {
  return absl::StrFormat("[%#x, %#x)", begin, end);
}

}  // namespace

// --- Memory --------------------------------------------------------------

cudaError_t Runtime::Malloc(void** ptr, size_t bytes) {
  return Allocate(ptr, bytes, Region::Kind::kDevice);
}

cudaError_t Runtime::HostAlloc(void** ptr, size_t bytes) {
  return Allocate(ptr, bytes, Region::Kind::kHostAlloc);
}

cudaError_t Runtime::Allocate(void** ptr, size_t bytes, Region::Kind kind) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  // cudaMalloc aligns to 256 bytes; cudaHostAlloc gives whole pages.
  const bool device = kind == Region::Kind::kDevice;
  const size_t align = device ? 256 : 4096;
  const size_t size = std::max(align, (bytes + align - 1) / align * align);
  Lock lock(mu_);
  void* data = std::aligned_alloc(align, size);
  if (data == nullptr) return Fail(cudaErrorMemoryAllocation);
  if (device) std::memset(data, kUninitialized, size);
  const auto begin = reinterpret_cast<uintptr_t>(data);
  regions_[begin] = {kind, begin, begin + bytes,
                     device ? current_device_index : -1};
  *ptr = data;
  return cudaSuccess;
}

cudaError_t Runtime::HostRegister(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) return Fail(cudaErrorInvalidValue);
  Lock lock(mu_);
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [unused, region] : regions_) {
    if (Overlaps(begin, begin + bytes, region.begin, region.end)) {
      return Fail(region.kind == Region::Kind::kDevice
                      ? cudaErrorInvalidValue
                      : cudaErrorHostMemoryAlreadyRegistered);
    }
  }
  regions_[begin] = {Region::Kind::kRegistered, begin, begin + bytes, -1};
  return cudaSuccess;
}

cudaError_t Runtime::Free(void* ptr) {
  return Release(ptr, Region::Kind::kDevice, cudaErrorInvalidValue, "cudaFree");
}

cudaError_t Runtime::FreeHost(void* ptr) {
  return Release(ptr, Region::Kind::kHostAlloc, cudaErrorInvalidValue,
                 "cudaFreeHost");
}

cudaError_t Runtime::HostUnregister(void* ptr) {
  return Release(ptr, Region::Kind::kRegistered,
                 cudaErrorHostMemoryNotRegistered, "cudaHostUnregister");
}

cudaError_t Runtime::Release(void* ptr, Region::Kind kind, cudaError_t unknown,
                             const char* call) {
  if (ptr == nullptr && kind != Region::Kind::kRegistered) {
    return cudaSuccess;  // freeing null is a no-op, as in cudart
  }
  Lock lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (ptr == nullptr || it == regions_.end() || it->second.kind != kind) {
    return Fail(unknown);
  }
  if (std::string use = UseOf(it->second.begin, it->second.end); !use.empty()) {
    Violation(absl::StrFormat("%s(%p) while %s", call, ptr, use));
    return Fail(cudaErrorIllegalState);  // the memory stays valid
  }
  regions_.erase(it);
  if (kind != Region::Kind::kRegistered) std::free(ptr);
  return cudaSuccess;
}

const Region* Runtime::RegionOf(uintptr_t begin, uintptr_t end,
                                bool* partial) const {
  // Regions never overlap one another: the one that starts at or before
  // `begin` may hold it; any other that starts before `end` cuts it.
  *partial = false;
  const Region* holder = nullptr;
  auto after = regions_.upper_bound(begin);
  if (after != regions_.begin()) {
    const Region& before = std::prev(after)->second;
    if (before.end > begin) {
      if (end <= before.end) holder = &before;
      *partial = holder == nullptr;
    }
  }
  if (after != regions_.end() && after->first < end) *partial = true;
  return *partial ? nullptr : holder;
}

// --- Who uses which bytes --------------------------------------------------

void Runtime::Enqueue(StreamState& stream, Op op) {
  op.seq = ++stream.enqueued;
  for (const Piece& piece : op.pieces) {
    op.uses.push_back(uses_.emplace(
        piece.DstBegin(), Use{piece.DstEnd(), &stream, op.seq, true}));
    longest_use_ = std::max(longest_use_, piece.DstEnd() - piece.DstBegin());
    if (piece.src != nullptr) {
      op.uses.push_back(uses_.emplace(
          piece.SrcBegin(), Use{piece.SrcEnd(), &stream, op.seq, false}));
      longest_use_ = std::max(longest_use_, piece.SrcEnd() - piece.SrcBegin());
    }
  }
  stream.queue.push_back(std::move(op));
  changed_.notify_all();
}

void Runtime::Untrack(std::vector<Uses::iterator>& uses) {
  for (Uses::iterator use : uses) uses_.erase(use);
  uses.clear();
}

template <typename Filter>
const Use* Runtime::FindUse(uintptr_t begin, uintptr_t end,
                            Filter filter) const {
  auto it = uses_.lower_bound(begin > longest_use_ ? begin - longest_use_ : 0);
  for (; it != uses_.end() && it->first < end; ++it) {
    if (it->second.end > begin && filter(it->second)) return &it->second;
  }
  return nullptr;
}

std::string Runtime::Hazard(const StreamState& stream, uintptr_t begin,
                            uintptr_t end, bool write) const {
  const Use* use = FindUse(begin, end, [&](const Use& other) {
    if (other.stream == &stream || (!write && !other.write)) return false;
    auto waited = stream.waits.find(other.stream->id);
    return waited == stream.waits.end() || other.seq > waited->second;
  });
  if (use == nullptr) return "";
  return absl::StrFormat(
      "%s %s, bytes that operation %d of stream %s %s and has not completed "
      "(or nobody has observed), and no event orders the two",
      write ? "writes" : "reads", Range(begin, end), use->seq,
      use->stream->name, use->write ? "writes" : "reads");
}

std::string Runtime::UseOf(uintptr_t begin, uintptr_t end) const {
  const Use* use = FindUse(begin, end, [](const Use&) { return true; });
  if (use == nullptr) return "";
  return absl::StrFormat(
      "operation %d of stream %s, not complete or not observed, %s %s",
      use->seq, use->stream->name, use->write ? "writes into" : "reads from",
      Range(begin, end));
}

void Runtime::Violation(std::string what) {
  violations_.push_back(std::move(what));
}

// --- Copies and sets --------------------------------------------------------

cudaError_t Runtime::Copy(std::vector<Piece> pieces, cudaMemcpyKind kind,
                          cudaStream_t stream, const char* function) {
  Lock lock(mu_);
  cudaError_t error = cudaSuccess;
  std::shared_ptr<StreamState> state = StreamOf(stream, &error);
  if (state == nullptr) return Fail(error);
  std::erase_if(pieces,
                [](const Piece& p) { return p.width == 0 || p.rows == 0; });
  if (pieces.empty()) return cudaSuccess;
  // Check every piece before queueing any: a failed call queues nothing.
  std::vector<bool> to_host(pieces.size());
  int64_t pageable = 0, bytes = 0;
  double seconds = config_.seconds_per_copy_call;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    if (piece.dst == nullptr || piece.src == nullptr) {
      return Fail(cudaErrorInvalidValue);
    }
    if (piece.rows > 1 &&
        (piece.dst_pitch < piece.width || piece.src_pitch < piece.width)) {
      return Fail(cudaErrorInvalidPitchValue);
    }
    bool src_partial = false, dst_partial = false;
    const Region* src =
        RegionOf(piece.SrcBegin(), piece.SrcEnd(), &src_partial);
    const Region* dst =
        RegionOf(piece.DstBegin(), piece.DstEnd(), &dst_partial);
    if (src_partial || dst_partial) return Fail(cudaErrorInvalidValue);
    const bool src_device =
        src != nullptr && src->kind == Region::Kind::kDevice;
    const bool dst_device =
        dst != nullptr && dst->kind == Region::Kind::kDevice;
    const bool direction_ok =
        kind == cudaMemcpyDeviceToHost     ? src_device && !dst_device
        : kind == cudaMemcpyHostToDevice   ? !src_device && dst_device
        : kind == cudaMemcpyDeviceToDevice ? src_device && dst_device
        : kind == cudaMemcpyDefault        ? src_device || dst_device
                                           : false;
    if (!direction_ok) return Fail(cudaErrorInvalidValue);
    for (const auto& [begin, end, write] :
         {std::tuple(piece.DstBegin(), piece.DstEnd(), true),
          std::tuple(piece.SrcBegin(), piece.SrcEnd(), false)}) {
      if (std::string hazard = Hazard(*state, begin, end, write);
          !hazard.empty()) {
        Violation(absl::StrFormat("%s on stream %s %s", function, state->name,
                                  hazard));
        return Fail(cudaErrorIllegalState);
      }
    }
    to_host[i] = !dst_device;
    if ((!src_device && src == nullptr) || (!dst_device && dst == nullptr)) {
      ++pageable;
    }
    const size_t piece_bytes = piece.width * piece.rows;
    bytes += static_cast<int64_t>(piece_bytes);
    const double bytes_per_s = to_host[i] ? config_.device_to_host_bytes_per_s
                                          : config_.host_to_device_bytes_per_s;
    if (bytes_per_s > 0)
      seconds += static_cast<double>(piece_bytes) / bytes_per_s;
  }
  DeviceCounts& counts = devices_[state->device].counts;
  ++counts.copy_calls;
  counts.copies += static_cast<int64_t>(pieces.size());
  counts.bytes += bytes;
  counts.pageable_copies += pageable;
  if (config_.device_to_host_bytes_per_s > 0 ||
      config_.host_to_device_bytes_per_s > 0) {
    counts.modelled_seconds += seconds;
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    // Poison, unless an earlier op of this stream still uses the bytes
    // (stream order makes that legal; the poison would land first).
    const Piece& piece = pieces[i];
    const StreamState* own = state.get();
    if (FindUse(piece.DstBegin(), piece.DstEnd(), [own](const Use& use) {
          return use.stream == own;
        }) == nullptr) {
      FillRows(piece, kPoison);
    }
    Op op;
    op.kind = Op::Kind::kCopy;
    op.pieces = {piece};
    op.host_dst = to_host[i];
    if (i == 0) op.modelled_seconds += config_.seconds_per_copy_call;
    const double bytes_per_s = to_host[i] ? config_.device_to_host_bytes_per_s
                                          : config_.host_to_device_bytes_per_s;
    if (bytes_per_s > 0) {
      op.modelled_seconds +=
          static_cast<double>(piece.width * piece.rows) / bytes_per_s;
    }
    Enqueue(*state, std::move(op));
  }
  if (pageable == 0) return cudaSuccess;
  // Pageable host memory: the call returns once the copy is done.
  const uint64_t seq = state->enqueued;
  changed_.wait(lock, [&] { return state->run >= seq; });
  return Observe(*state, seq);
}

cudaError_t Runtime::Memset(void* dst, int value, size_t bytes,
                            cudaStream_t stream, bool synchronous) {
  Lock lock(mu_);
  cudaError_t error = cudaSuccess;
  std::shared_ptr<StreamState> state = StreamOf(stream, &error);
  if (state == nullptr) return Fail(error);
  if (bytes == 0) return cudaSuccess;
  const Piece piece{static_cast<uint8_t*>(dst), bytes, nullptr, 0, bytes, 1};
  bool partial = false;
  const Region* region = RegionOf(piece.DstBegin(), piece.DstEnd(), &partial);
  if (dst == nullptr || region == nullptr ||
      region->kind != Region::Kind::kDevice) {
    return Fail(cudaErrorInvalidValue);
  }
  if (std::string hazard =
          Hazard(*state, piece.DstBegin(), piece.DstEnd(), true);
      !hazard.empty()) {
    Violation(
        absl::StrFormat("cudaMemset on stream %s %s", state->name, hazard));
    return Fail(cudaErrorIllegalState);
  }
  Op op;
  op.kind = Op::Kind::kMemset;
  op.pieces = {piece};
  op.value = value;
  Enqueue(*state, std::move(op));
  if (!synchronous) return cudaSuccess;
  const uint64_t seq = state->enqueued;
  changed_.wait(lock, [&] { return state->run >= seq; });
  return Observe(*state, seq);
}

}  // namespace hoist::cuda_sim::internal
