// A shared restore's boxes and extents survive the wire, and anything that
// is not one of them for the manifest at hand is refused.
#include "hoist/checkpoint/restore/shared_plan_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hoist {
namespace {

using ::testing::HasSubstr;

Manifest TwoArrays() {
  Manifest m;
  m.step = 3;
  ManifestArray w{"w", DType::kFloat32, {8, 4}, "", {}};
  w.extents.push_back({Box({0, 0}, {4, 4}), "data/3f/r00000_w00.bin", 4096, 64,
                       ExtentHash{.low = 1, .high = 2, .wide = true},
                       std::optional<int64_t>(1)});
  w.extents.push_back({Box({4, 0}, {4, 4}), "data/r00001_w00.bin", 0, 64,
                       ExtentHash{.low = 3, .high = 4, .wide = true},
                       std::nullopt});
  ManifestArray count{"count", DType::kInt32, {}, "", {}};
  count.extents.push_back({Box(), "data/r00000_w00.bin", 8192, 4,
                           ExtentHash{.low = 5, .high = 0, .wide = false},
                           std::nullopt});
  m.arrays = {w, count};
  return m;
}

RestoreTarget Target(std::string name, DType dtype, std::vector<int64_t> shape,
                     std::vector<Box> boxes) {
  RestoreTarget target{.name = std::move(name),
                       .dtype = dtype,
                       .shape = std::move(shape),
                       .destinations = {}};
  for (Box& box : boxes) {
    target.destinations.push_back(
        {.box = std::move(box), .device = nullptr, .data = nullptr, .tag = 0});
  }
  return target;
}

TEST(SharedPlanCodecTest, BoxesOfKnownArraysRoundTripAndTheRestAreLeftOut) {
  const Manifest m = TwoArrays();
  const ManifestIndex index(m);
  const std::vector<RestoreTarget> targets = {
      Target("w", DType::kFloat32, {8, 4},
             {Box({2, 0}, {4, 4}), Box({0, 0}, {0, 4}), Box({6, 0}, {4, 4})}),
      Target("count", DType::kInt32, {}, {Box()}),
      Target("w", DType::kInt32, {8, 4}, {Box({0, 0}, {1, 1})}),  // dtype
      Target("nope", DType::kFloat32, {1}, {Box({0}, {1})}),
  };
  absl::StatusOr<std::vector<ArrayBox>> boxes =
      DecodeBoxes(EncodeBoxes(m, index, targets), m, 3);
  ASSERT_TRUE(boxes.ok()) << boxes.status();
  ASSERT_EQ(boxes->size(), 2u);  // empty, outside, mismatched, unknown: out
  EXPECT_EQ((*boxes)[0].array, 0);
  EXPECT_EQ((*boxes)[0].box, Box({2, 0}, {4, 4}));
  EXPECT_EQ((*boxes)[1].array, 1);
  EXPECT_EQ((*boxes)[1].box, Box());
}

TEST(SharedPlanCodecTest, MalformedBoxesNameTheRank) {
  const Manifest m = TwoArrays();
  std::string text;
  WireWriter out(text);
  out.Put(int32_t{0});
  for (int64_t v : {0, 0, 9, 4}) out.Put(v);  // 9 rows of an 8-row array
  absl::StatusOr<std::vector<ArrayBox>> boxes = DecodeBoxes(text, m, 5);
  EXPECT_EQ(boxes.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(boxes.status().message(), HasSubstr("rank 5"));
  EXPECT_FALSE(DecodeBoxes(text.substr(0, 7), m, 5).ok());  // cut short
  std::string unknown;
  WireWriter(unknown).Put(int32_t{2});  // no array 2
  EXPECT_FALSE(DecodeBoxes(unknown, m, 5).ok());
}

TEST(SharedPlanCodecTest, ExtentsRoundTripAndForeignOnesAreRefused) {
  const Manifest m = TwoArrays();
  std::string text;
  WireWriter out(text);
  PutExtent(out, 0, m.arrays[0].extents[0]);
  PutExtent(out, 2, m.arrays[1].extents[0]);
  WireReader in(text);
  int64_t id = -1;
  ManifestExtent extent;
  ASSERT_TRUE(in.Take(id));
  EXPECT_EQ(id, 0);
  ASSERT_TRUE(TakeExtent(in, m.arrays[0], extent));
  EXPECT_EQ(extent, m.arrays[0].extents[0]);
  ASSERT_TRUE(in.Take(id));
  EXPECT_EQ(id, 2);
  ASSERT_TRUE(TakeExtent(in, m.arrays[1], extent));
  EXPECT_EQ(extent, m.arrays[1].extents[0]);
  EXPECT_TRUE(in.done());
  // w's extent read as one of `count` (a scalar): its box does not fit.
  WireReader wrong(text);
  ASSERT_TRUE(wrong.Take(id));
  EXPECT_FALSE(TakeExtent(wrong, m.arrays[1], extent));
  // An unsafe file name.
  ManifestExtent escape = m.arrays[0].extents[1];
  escape.file = "../outside.bin";
  std::string bad;
  WireWriter bad_out(bad);
  PutExtent(bad_out, 1, escape);
  WireReader bad_in(bad);
  ASSERT_TRUE(bad_in.Take(id));
  EXPECT_FALSE(TakeExtent(bad_in, m.arrays[0], extent));
}

}  // namespace
}  // namespace hoist
