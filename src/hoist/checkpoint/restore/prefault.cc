#include "hoist/checkpoint/restore/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "hoist/base/checked_math.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace hoist {
namespace {

constexpr int64_t kPieceBytes = int64_t{8} << 20;

}  // namespace

Prefaulter::Prefaulter(std::vector<PrefaultRange> ranges,
                       const std::atomic<size_t>& taken, int threads)
    : taken_(taken) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (const PrefaultRange& range : ranges) {
    if (range.bytes <= 0) continue;
    // Whole pages: the bytes around the range in its first and last page
    // are faulted in with it, as a write to the range would.
    const auto start = static_cast<int64_t>(
        reinterpret_cast<uintptr_t>(range.data) / page * page);
    const int64_t end =
        AlignUp(static_cast<int64_t>(reinterpret_cast<uintptr_t>(range.data)) +
                    range.bytes,
                page);
    for (int64_t at = start; at < end; at += kPieceBytes) {
      pieces_.push_back({range.run, reinterpret_cast<uint8_t*>(at),
                         std::min(kPieceBytes, end - at)});
    }
  }
  if (pieces_.empty()) return;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

Prefaulter::~Prefaulter() {
  stop_.store(true);
  Join();
}

void Prefaulter::Join() {
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void Prefaulter::Run() {
  for (size_t i = next_.fetch_add(1); i < pieces_.size() && !stop_.load();
       i = next_.fetch_add(1)) {
    const Piece& piece = pieces_[i];
    if (piece.run < taken_.load(std::memory_order_relaxed)) continue;
    if (madvise(piece.data, piece.bytes, MADV_POPULATE_WRITE) != 0) {
      stop_.store(true);  // refused: the reads fault the rest
      return;
    }
    populated_.fetch_add(piece.bytes);
  }
}

}  // namespace hoist
