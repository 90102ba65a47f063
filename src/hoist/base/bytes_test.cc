#include "hoist/base/bytes.h"

#include <gtest/gtest.h>

#include "hoist/base/checked_math.h"

namespace hoist {
namespace {

TEST(FormatBytesTest, PicksBinaryUnit) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(4096), "4.00 KiB");
  EXPECT_EQ(FormatBytes(1.5 * kGiB), "1.50 GiB");
  EXPECT_EQ(FormatBytes(300 * kMiB), "300.0 MiB");
}

TEST(ParseBytesTest, AcceptsPlainAndSuffixedSizes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096);
  EXPECT_EQ(*ParseBytes("64K"), 64 * kKiB);
  EXPECT_EQ(*ParseBytes("64KiB"), 64 * kKiB);
  EXPECT_EQ(*ParseBytes("2 MiB"), 2 * kMiB);
  EXPECT_EQ(*ParseBytes("1.5g"), 3 * kGiB / 2);
  EXPECT_EQ(*ParseBytes("10b"), 10);
}

TEST(ParseBytesTest, RejectsGarbageNegativeAndHuge) {
  for (const char* text : {"", "abc", "-1", "12X", "1e30", "nan"}) {
    auto parsed = ParseBytes(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(CheckedMathTest, DetectsOverflow) {
  EXPECT_EQ(CheckedMul(int64_t{1} << 40, 1 << 10), int64_t{1} << 50);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 40, int64_t{1} << 40).has_value());
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
  EXPECT_EQ(AlignUp(0, 4096), 0);
  EXPECT_EQ(AlignUp(1, 4096), 4096);
  EXPECT_EQ(AlignUp(8192, 4096), 8192);
}

}  // namespace
}  // namespace hoist
