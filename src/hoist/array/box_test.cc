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

}  // namespace
}  // namespace hoist
