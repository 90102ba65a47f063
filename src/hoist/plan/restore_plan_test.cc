#include "hoist/restore_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

// A (256, 64) float32 array (rows of 256 bytes, 64 KiB) saved as 4 row
// blocks of 64 rows (16 KiB each), and a (10,) int8 array saved whole.
std::vector<SavedArray> Saved() {
  SavedArray w{"w", 4, {256, 64}, {}};
  for (int64_t r = 0; r < 256; r += 64) {
    w.extents.push_back(Box({r, 0}, {64, 64}));
  }
  SavedArray b{"b", 1, {10}, {Box({0}, {10})}};
  return {w, b};
}

std::vector<int> ExtentsRead(const RestoreWave& wave, int array) {
  std::vector<int> extents;
  for (const RestoreRead& read : wave.reads) {
    if (read.array == array) extents.push_back(read.extent);
  }
  return extents;
}

TEST(RestorePlanTest, ReadsOnlyTheExtentsAnImageMeets) {
  // Rows 120..135 meet extents 1 and 2 only.
  absl::StatusOr<RestorePlan> plan = PlanRestore(
      Saved(), {{0, Box({120, 0}, {16, 64}), true}}, int64_t{1} << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves.size(), 1u);
  EXPECT_THAT(ExtentsRead(plan->waves[0], 0), ElementsAre(1, 2));
  EXPECT_EQ(plan->waves[0].lease_bytes, 4096);
}

TEST(RestorePlanTest, ReplicasShareOneImageAndHostBoxesAreFilledInPlace) {
  const Box half({0, 0}, {128, 64});
  absl::StatusOr<RestorePlan> plan = PlanRestore(Saved(),
                                                 {{0, half, true},
                                                  {0, half, true},
                                                  {0, half, false},
                                                  {1, Box({0}, {10}), false}},
                                                 int64_t{1} << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->images.size(), 3u);
  // Images in the order of their first destination.
  const RestoreImage& shared = plan->images[0];
  EXPECT_FALSE(shared.in_place);
  EXPECT_THAT(shared.destinations, ElementsAre(Pair(0, 0), Pair(1, 0)));
  EXPECT_TRUE(plan->images[1].in_place);
  EXPECT_THAT(plan->images[1].destinations, ElementsAre(Pair(2, 0)));
  EXPECT_TRUE(plan->images[2].in_place);
  // One wave; extents 0 and 1 of w are read once, for both images.
  ASSERT_EQ(plan->waves.size(), 1u);
  EXPECT_THAT(ExtentsRead(plan->waves[0], 0), ElementsAre(0, 1));
  EXPECT_THAT(ExtentsRead(plan->waves[0], 1), ElementsAre(0));
  for (const RestoreRead& read : plan->waves[0].reads) {
    if (read.array == 0) {
      EXPECT_EQ(read.images.size(), 2u);
    }
  }
  EXPECT_EQ(plan->waves[0].lease_bytes, 32768);  // host images take none
}

TEST(RestorePlanTest, DeviceBoxesThatDoNotFitRunInWavesOfHalfThePool) {
  // Four 16 KiB device boxes through a 48 KiB pool: 64 KiB do not fit, so
  // waves of at most 24 KiB: one box each.
  std::vector<DestinationBox> boxes;
  for (int64_t r = 0; r < 256; r += 64) {
    boxes.push_back({0, Box({r, 0}, {64, 64}), true});
  }
  absl::StatusOr<RestorePlan> plan = PlanRestore(Saved(), boxes, 49152);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->waves.size(), 4u);
  for (int w = 0; w < 4; ++w) {
    EXPECT_EQ(plan->waves[w].lease_bytes, 16384);
    EXPECT_THAT(ExtentsRead(plan->waves[w], 0), ElementsAre(w));
  }
  // Through a 64 KiB pool they fit together: one wave.
  EXPECT_EQ(PlanRestore(Saved(), boxes, 65536)->waves.size(), 1u);
}

TEST(RestorePlanTest, ABoxLargerThanHalfThePoolIsRestoredInParts) {
  // The whole 64 KiB array onto a device through a 32 KiB pool: parts of at
  // most half the pool, each a contiguous run of the box at its own offset.
  absl::StatusOr<RestorePlan> plan =
      PlanRestore(Saved(), {{0, Box({0, 0}, {256, 64}), true}}, 32768);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t covered = 0;
  int64_t next_offset = 0;
  for (const RestoreImage& image : plan->images) {
    EXPECT_LE(image.bytes, 16384);
    ASSERT_EQ(image.destinations.size(), 1u);
    EXPECT_EQ(image.destinations[0].second, next_offset);  // contiguous runs
    next_offset += image.bytes;
    covered += image.bytes;
  }
  EXPECT_EQ(covered, 256 * 64 * 4);
  EXPECT_GE(plan->images.size(), 2u);
  for (const RestoreWave& wave : plan->waves) {
    EXPECT_LE(wave.lease_bytes, 16384);
  }
}

TEST(RestorePlanTest, ARowLargerThanHalfThePoolIsResourceExhausted) {
  SavedArray wide{"wide", 4, {2, 4096}, {Box({0, 0}, {2, 4096})}};
  absl::Status status =
      PlanRestore({wide}, {{0, Box({0, 0}, {2, 4096}), true}}, 16384).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("array 'wide'"));
  // Into host memory it needs no staging at all.
  EXPECT_TRUE(
      PlanRestore({wide}, {{0, Box({0, 0}, {2, 4096}), false}}, 16384).ok());
}

TEST(RestorePlanTest, BadDestinationsAreInvalidArgument) {
  EXPECT_EQ(PlanRestore(Saved(), {{0, Box({250, 0}, {8, 64}), true}}, 1 << 20)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PlanRestore(Saved(), {{5, Box({0}, {1}), true}}, 1 << 20).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      PlanRestore(Saved(), {{1, Box({0}, {0}), true}}, 1 << 20).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hoist
