#include "hoist/box.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hoist {
namespace {

using ::testing::ElementsAre;

TEST(BoxTest, ElementCountAndEmptiness) {
  EXPECT_EQ(Box().num_elements(), 1);  // scalar
  EXPECT_FALSE(Box().empty());
  EXPECT_EQ(Box({1, 2}, {3, 4}).num_elements(), 12);
  EXPECT_TRUE(Box({0, 0}, {3, 0}).empty());
}

TEST(BoxTest, IntersectOverlappingAndDisjoint) {
  const Box a({0, 0}, {4, 4});
  const Box b({2, 1}, {4, 2});
  EXPECT_EQ(a.Intersect(b), Box({2, 1}, {2, 2}));
  EXPECT_EQ(b.Intersect(a), Box({2, 1}, {2, 2}));
  EXPECT_TRUE(a.Intersect(Box({4, 0}, {1, 4})).empty());  // touching edge
  EXPECT_TRUE(a.Intersect(Box({10, 10}, {1, 1})).empty());
}

TEST(BoxTest, ContainsBoxesAndIndices) {
  const Box a({2, 2}, {4, 4});
  EXPECT_TRUE(a.Contains(Box({2, 2}, {4, 4})));
  EXPECT_TRUE(a.Contains(Box({3, 3}, {1, 3})));
  EXPECT_FALSE(a.Contains(Box({3, 3}, {1, 4})));
  EXPECT_FALSE(a.Contains(Box({1, 3}, {1, 1})));
  EXPECT_FALSE(a.Contains(Box({2}, {1})));         // rank differs
  EXPECT_TRUE(a.Contains(Box({100, 0}, {0, 5})));  // empty
  EXPECT_TRUE(a.ContainsIndex({5, 2}));
  EXPECT_FALSE(a.ContainsIndex({6, 2}));
  EXPECT_FALSE(a.ContainsIndex({2}));
}

TEST(BoxTest, CStridesAreRowMajor) {
  EXPECT_THAT(CStrides({2, 3, 4}), ElementsAre(12, 4, 1));
  EXPECT_THAT(CStrides({7}), ElementsAre(1));
  EXPECT_TRUE(CStrides({}).empty());
}

TEST(BoxTest, SplitEvenAlongEachAxis) {
  const Box box({10, 20}, {4, 6});
  EXPECT_THAT(box.Split(0, 2),
              ElementsAre(Box({10, 20}, {2, 6}), Box({12, 20}, {2, 6})));
  EXPECT_THAT(box.Split(1, 3),
              ElementsAre(Box({10, 20}, {4, 2}), Box({10, 22}, {4, 2}),
                          Box({10, 24}, {4, 2})));
}

TEST(BoxTest, SplitUnevenSizesDifferByAtMostOneAndTile) {
  const Box box({0, 0}, {7, 3});
  std::vector<Box> parts = box.Split(0, 3);
  EXPECT_THAT(parts, ElementsAre(Box({0, 0}, {3, 3}), Box({3, 0}, {2, 3}),
                                 Box({5, 0}, {2, 3})));
  int64_t total = 0;
  for (const Box& p : parts) total += p.num_elements();
  EXPECT_EQ(total, box.num_elements());
}

TEST(BoxTest, ByteSpanRunsFromTheFirstElementToTheLast) {
  const Box outer({10, 0}, {4, 6});  // rows 10-13, 6 columns
  // Whole rows: exactly their bytes.
  EXPECT_EQ(ByteSpan(outer, Box({11, 0}, {2, 6}), 4),
            std::make_pair(int64_t{24}, int64_t{72}));
  // Columns 2-3 of rows 11-12: from (11, 2) to the end of (12, 3).
  EXPECT_EQ(ByteSpan(outer, Box({11, 2}, {2, 2}), 4),
            std::make_pair(int64_t{32}, int64_t{64}));
  // One element; and the whole box.
  EXPECT_EQ(ByteSpan(outer, Box({13, 5}, {1, 1}), 2),
            std::make_pair(int64_t{46}, int64_t{48}));
  EXPECT_EQ(ByteSpan(outer, outer, 1), std::make_pair(int64_t{0}, int64_t{24}));
  EXPECT_EQ(ByteSpan(Box(), Box(), 8), std::make_pair(int64_t{0}, int64_t{8}));
}

TEST(BoxTest, RelativeToShiftsOrigin) {
  EXPECT_EQ(Box({5, 7}, {2, 2}).RelativeTo(Box({4, 4}, {4, 6})),
            Box({1, 3}, {2, 2}));
}

TEST(BoxTest, CreateValidates) {
  EXPECT_TRUE(Box::Create({0}, {3}).ok());
  EXPECT_EQ(Box::Create({0, 1}, {3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Box::Create({-1}, {3}).ok());
  EXPECT_FALSE(Box::Create({0}, {-3}).ok());
  EXPECT_FALSE(Box::Create({INT64_MAX}, {1}).ok());
}

TEST(BoxTest, CheckedNumElementsRejectsOverflowAndNegative) {
  EXPECT_EQ(*CheckedNumElements({}), 1);
  EXPECT_EQ(*CheckedNumElements({3, 0}), 0);
  EXPECT_EQ(*CheckedNumElements({1 << 20, 1 << 20}), int64_t{1} << 40);
  EXPECT_EQ(
      CheckedNumElements({int64_t{1} << 40, int64_t{1} << 40}).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CheckedNumElements({4, -1}).ok());
}

TEST(BoxTest, ToStringShowsHalfOpenRanges) {
  EXPECT_EQ(Box({0, 8}, {4, 8}).ToString(), "[0:4, 8:16]");
  EXPECT_EQ(Box().ToString(), "[]");
  EXPECT_EQ(ShapeToString({8, 1024}), "(8, 1024)");
  EXPECT_EQ(ShapeToString({5}), "(5,)");
}

TEST(FindOverlapTest, GridsAndSlicesAreDisjoint) {
  std::vector<Box> boxes;
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 3; ++c) {
      // Each shard cut into 2 slices along axis 0, and some empty boxes.
      boxes.push_back(Box({r * 10, c * 7}, {4, 7}));
      boxes.push_back(Box({r * 10 + 4, c * 7}, {6, 7}));
      boxes.push_back(Box({r * 10, c * 7}, {0, 7}));
    }
  }
  EXPECT_EQ(*FindOverlap(boxes), std::nullopt);
  boxes.push_back(Box({15, 6}, {1, 2}));  // straddles two shards
  absl::StatusOr<std::optional<BoxOverlap>> overlap = FindOverlap(boxes);
  ASSERT_TRUE(overlap.ok() && overlap->has_value());
  EXPECT_EQ((*overlap)->second, boxes.size() - 1);
  EXPECT_FALSE(boxes[(*overlap)->first].Intersect(boxes.back()).empty());
}

TEST(FindOverlapTest, IdenticalBoxesAndScalarsOverlap) {
  EXPECT_TRUE(FindOverlap({Box({0}, {4}), Box({0}, {4})})->has_value());
  EXPECT_TRUE(FindOverlap({Box(), Box()})->has_value());
  EXPECT_FALSE(FindOverlap({Box()})->has_value());
}

// Five boxes no straight cut separates (a pinwheel around a center): the
// pairwise comparison decides.
TEST(FindOverlapTest, PinwheelIsComparedPairwise) {
  std::vector<Box> pinwheel = {Box({0, 0}, {2, 1}), Box({2, 0}, {1, 2}),
                               Box({1, 2}, {2, 1}), Box({0, 1}, {1, 2}),
                               Box({1, 1}, {1, 1})};
  EXPECT_EQ(*FindOverlap(pinwheel), std::nullopt);
  pinwheel[4] = Box({1, 1}, {2, 1});  // the center reaches into B
  EXPECT_TRUE(FindOverlap(pinwheel)->has_value());
}

// Nested L-shaped shells peel off one box per cut: a hostile input for
// which the work would be quadratic. It is refused, in bounded time.
TEST(FindOverlapTest, WorkIsBoundedForInterlockingInput) {
  constexpr int64_t n = 1000;
  std::vector<Box> shells;
  for (int64_t i = 0; i < n; ++i) {
    shells.push_back(Box({i, i}, {1, n - i}));
    if (i + 1 < n) shells.push_back(Box({i + 1, i}, {n - i - 1, 1}));
  }
  absl::StatusOr<std::optional<BoxOverlap>> overlap = FindOverlap(shells);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(overlap.status().message()),
              ::testing::HasSubstr("interlock"));
}

}  // namespace
}  // namespace hoist
