#include "hoist/base/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hoist {
namespace {

#if defined(__x86_64__)
constexpr size_t kLineBytes = 64;

// Streams `lines` whole lines from `src` to `dst` (64-byte aligned).
__attribute__((target("avx2"))) void StreamLinesAvx2(uint8_t* dst,
                                                     const uint8_t* src,
                                                     size_t lines) {
  for (size_t i = 0; i < lines; ++i, dst += kLineBytes, src += kLineBytes) {
    const __m256i low =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i high =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), low);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), high);
  }
}

// The same with SSE2, which every x86-64 CPU has.
void StreamLinesSse2(uint8_t* dst, const uint8_t* src, size_t lines) {
  for (size_t i = 0; i < lines; ++i, dst += kLineBytes, src += kLineBytes) {
    for (size_t at = 0; at < kLineBytes; at += 16) {
      _mm_stream_si128(
          reinterpret_cast<__m128i*>(dst + at),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + at)));
    }
  }
}

bool HasAvx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#else
bool HasAvx2() { return false; }
#endif

// StreamCopy, with AVX2's stores or SSE2's, unfenced: true if it streamed.
bool Copy(void* dst, const void* src, size_t bytes, bool avx2) {
#if defined(__x86_64__)
  if (bytes >= kStreamCopyMinBytes) {
    auto* out = static_cast<uint8_t*>(dst);
    const auto* in = static_cast<const uint8_t*>(src);
    // memcpy up to the destination's first line, stream its whole lines,
    // memcpy the tail.
    const size_t head =
        (kLineBytes - reinterpret_cast<uintptr_t>(out) % kLineBytes) %
        kLineBytes;
    std::memcpy(out, in, head);
    const size_t lines = (bytes - head) / kLineBytes;
    if (avx2) {
      StreamLinesAvx2(out + head, in + head, lines);
    } else {
      StreamLinesSse2(out + head, in + head, lines);
    }
    const size_t done = head + lines * kLineBytes;
    std::memcpy(out + done, in + done, bytes - done);
    return true;
  }
#endif
  std::memcpy(dst, src, bytes);
  return false;
}

// Non-temporal stores are not ordered with later ones: fence them, so that
// whatever tells another thread the copies are done comes after them.
void Fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

StreamCopies::~StreamCopies() {
  if (streamed_) Fence();
}

void StreamCopies::Copy(void* dst, const void* src, size_t bytes) {
  streamed_ |= hoist::Copy(dst, src, bytes, HasAvx2());
}

void StreamCopy(void* dst, const void* src, size_t bytes) {
  StreamCopies().Copy(dst, src, bytes);
}

void StreamCopySse2ForTest(void* dst, const void* src, size_t bytes) {
  if (Copy(dst, src, bytes, false)) Fence();
}

}  // namespace hoist
