// Copying large buffers with non-temporal stores, as hoist's own copies
// move a save's or a restore's bytes: staging (the host backend's stand-in
// for DMA), and a restore's copies out of its readers' buffers.
//
// A plain store first reads the destination's cache line (to own it), so a
// copy of data far larger than the cache moves three bytes through memory
// for every byte copied: the source read, the destination read, the
// destination written back. A non-temporal store writes whole lines
// without reading them and leaves the cache to the training job's data.
// Here (AMD EPYC VM, bench/results/stream-copy-2026-12-04.txt) one thread
// copying 1 GiB in pieces of 4 KiB - 1 GiB reached 28 GB/s this way against
// 18-24 GB/s for memcpy, which on this CPU stores through the cache at every
// size.
#ifndef HOIST_BASE_STREAM_COPY_H_
#define HOIST_BASE_STREAM_COPY_H_

#include <cstddef>

namespace hoist {

// Copies are streamed from this many bytes on; smaller ones are memcpy's
// (their destination is likely still to be read from the cache, and a
// fence per copy would cost more than the stores save).
inline constexpr size_t kStreamCopyMinBytes = 4096;

// Copies `bytes` bytes from `src` to `dst` (not overlapping), as memcpy.
// From kStreamCopyMinBytes on, on x86-64, the destination's whole 64-byte
// lines are written with non-temporal stores (AVX2 where the running CPU
// has it, else SSE2) and the rest with memcpy, and the stores are fenced
// before it returns: the bytes are visible to any thread that synchronizes
// with this one afterwards, as after a memcpy. Elsewhere, memcpy.
void StreamCopy(void* dst, const void* src, size_t bytes);

// Copies one after another as StreamCopy does, their stores fenced once,
// when the last is done (on destruction), rather than after each: the rows
// of a strided copy.
class StreamCopies {
 public:
  StreamCopies() = default;
  ~StreamCopies();
  StreamCopies(const StreamCopies&) = delete;
  StreamCopies& operator=(const StreamCopies&) = delete;

  void Copy(void* dst, const void* src, size_t bytes);

 private:
  bool streamed_ = false;  // a store to fence
};

// StreamCopy with SSE2's stores even where the CPU has AVX2 (tests).
void StreamCopySse2ForTest(void* dst, const void* src, size_t bytes);

}  // namespace hoist

#endif  // HOIST_BASE_STREAM_COPY_H_
