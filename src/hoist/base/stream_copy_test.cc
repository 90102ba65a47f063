#include "hoist/base/stream_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace hoist {
namespace {

// Every byte position distinct (mod 251), so a byte copied from or to the
// wrong place shows.
std::vector<uint8_t> Pattern(size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i % 251);
  return out;
}

// StreamCopy, or its SSE2 stores where the CPU has AVX2 too.
void CheckEverySizeAndAlignment(void (*copy)(void*, const void*, size_t)) {
  const std::vector<uint8_t> source = Pattern(3 * kStreamCopyMinBytes + 300);
  const std::vector<size_t> sizes = {0,
                                     1,
                                     63,
                                     64,
                                     65,
                                     kStreamCopyMinBytes - 1,
                                     kStreamCopyMinBytes,
                                     kStreamCopyMinBytes + 1,
                                     kStreamCopyMinBytes + 63,
                                     2 * kStreamCopyMinBytes + 129,
                                     3 * kStreamCopyMinBytes};
  for (size_t size : sizes) {
    for (size_t src_at : {0, 1, 17, 64}) {
      for (size_t dst_at : {0, 1, 31, 32, 63, 64, 65}) {
        std::vector<uint8_t> target(size + 256, 0xEE);
        copy(target.data() + dst_at, source.data() + src_at, size);
        for (size_t i = 0; i < target.size(); ++i) {
          const bool inside = i >= dst_at && i < dst_at + size;
          const uint8_t expected =
              inside ? source[src_at + (i - dst_at)] : uint8_t{0xEE};
          ASSERT_EQ(target[i], expected) << "size " << size << " src+" << src_at
                                         << " dst+" << dst_at << " byte " << i;
        }
      }
    }
  }
}

TEST(StreamCopyTest, CopiesEverySizeAndAlignmentExactlyAndNothingElse) {
  CheckEverySizeAndAlignment(&StreamCopy);
}

TEST(StreamCopyTest, Sse2StoresCopyEverySizeAndAlignmentToo) {
  CheckEverySizeAndAlignment(&StreamCopySse2ForTest);
}

// The rows of a strided copy, fenced once: every row lands, the gaps
// between them stay.
TEST(StreamCopyTest, StreamCopiesCopiesEveryRowAndNothingElse) {
  constexpr size_t kRow = kStreamCopyMinBytes + 100, kPitch = kRow + 77;
  constexpr size_t kRows = 5;
  const std::vector<uint8_t> source = Pattern(kRows * kRow);
  std::vector<uint8_t> target(kRows * kPitch, 0xEE);
  {
    StreamCopies rows;
    for (size_t r = 0; r < kRows; ++r) {
      rows.Copy(target.data() + r * kPitch, source.data() + r * kRow, kRow);
    }
  }
  for (size_t i = 0; i < target.size(); ++i) {
    const size_t row = i / kPitch, at = i % kPitch;
    const uint8_t expected =
        at < kRow ? source[row * kRow + at] : uint8_t{0xEE};
    ASSERT_EQ(target[i], expected) << "byte " << i;
  }
}

}  // namespace
}  // namespace hoist
