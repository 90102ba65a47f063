#include "hoist/diff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "hoist/checkpoint_manager.h"
#include "testing/manager_test.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::ManagerTest;

ManifestExtent Extent(std::vector<int64_t> origin, std::vector<int64_t> shape,
                      uint64_t hash, std::optional<int64_t> step = {}) {
  ManifestExtent extent;
  extent.box = Box(std::move(origin), std::move(shape));
  extent.length_bytes = extent.box.num_elements() * 4;
  extent.hash = {hash, hash, true};
  extent.step = step;
  return extent;
}

ManifestArray Array(std::string name, std::vector<int64_t> shape,
                    std::vector<ManifestExtent> extents,
                    DType dtype = DType::kFloat32) {
  return {std::move(name), dtype, std::move(shape), "", std::move(extents)};
}

std::vector<std::string> NamesOf(const StepDiff& diff) {
  std::vector<std::string> names;
  for (const ArrayDiff& array : diff.changed) names.push_back(array.name);
  return names;
}

TEST(DiffManifests, NamesWhatWasAddedRemovedRetypedAndWhichExtentsChanged) {
  Manifest a, b;
  a.step = 1;
  b.step = 2;
  a.arrays = {Array("same", {8}, {Extent({0}, {4}, 1), Extent({4}, {4}, 2)}),
              Array("half", {8}, {Extent({0}, {4}, 3), Extent({4}, {4}, 4)}),
              Array("gone", {2}, {Extent({0}, {2}, 5)}),
              Array("reshaped", {4}, {Extent({0}, {4}, 6)}),
              Array("retyped", {4}, {Extent({0}, {4}, 7)})};
  b.arrays = {
      // A delta's extent (step 1's bytes) with the same hash: unchanged.
      Array("same", {8}, {Extent({0}, {4}, 1, 1), Extent({4}, {4}, 2, 1)}),
      Array("half", {8}, {Extent({0}, {4}, 3), Extent({4}, {4}, 40)}),
      Array("new", {2}, {Extent({0}, {2}, 8)}),
      Array("reshaped", {2, 2}, {Extent({0, 0}, {2, 2}, 6)}),
      Array("retyped", {4}, {Extent({0}, {4}, 7)}, DType::kInt32)};
  const StepDiff diff = DiffManifests(a, b);
  EXPECT_EQ(diff.step_a, 1);
  EXPECT_EQ(diff.step_b, 2);
  EXPECT_THAT(diff.added, ElementsAre("new"));
  EXPECT_THAT(diff.removed, ElementsAre("gone"));
  EXPECT_EQ(diff.unchanged, 1);
  ASSERT_THAT(NamesOf(diff), ElementsAre("half", "reshaped", "retyped"));
  const ArrayDiff& half = diff.changed[0];
  EXPECT_FALSE(half.retyped);
  EXPECT_EQ(half.extents, 2);
  ASSERT_EQ(half.changed_extents.size(), 1u);
  EXPECT_EQ(half.changed_extents[0], Box({4}, {4}));
  EXPECT_EQ(half.changed_bytes, 16);
  EXPECT_TRUE(diff.changed[1].retyped);  // same name, other shape
  EXPECT_THAT(diff.changed[1].shape_a, ElementsAre(4));
  EXPECT_THAT(diff.changed[1].shape_b, ElementsAre(2, 2));
  EXPECT_TRUE(diff.changed[2].retyped);
  EXPECT_EQ(diff.changed[2].dtype_b, DType::kInt32);
}

TEST(DiffManifests, BoxesInAnotherOrderMatchOtherBoxesCountAsChanged) {
  Manifest a, b;
  a.arrays = {
      Array("moved", {8}, {Extent({0}, {4}, 1), Extent({4}, {4}, 2)}),
      Array("resharded", {8}, {Extent({0}, {4}, 3), Extent({4}, {4}, 4)})};
  b.arrays = {Array("moved", {8}, {Extent({4}, {4}, 2), Extent({0}, {4}, 1)}),
              Array("resharded", {8}, {Extent({0}, {8}, 9)})};
  const StepDiff diff = DiffManifests(a, b);
  EXPECT_EQ(diff.unchanged, 1);
  ASSERT_THAT(NamesOf(diff), ElementsAre("resharded"));
  EXPECT_TRUE(diff.changed[0].resharded);
  EXPECT_EQ(diff.changed[0].changed_bytes, 32);
}

// Real saves: a step saved again unchanged (every extent referenced), then
// one array changed; --values reads only it and finds the largest change.
TEST_F(ManagerTest, DiffOfSavedStepsFindsTheChangedArrayAndItsLargestChange) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
    ASSERT_TRUE(manager->Save(2, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
    // params/b (float32, 48 elements over 4 shards): element 0 of its
    // first shard gains 0.5 (every replica of that shard alike).
    for (size_t a = 0; a < model_.size(); ++a) {
      if (model_[a].name != "params/b") continue;
      for (const auto& shard : shards_.placed[a]) {
        if (shard.box.origin()[0] != 0) continue;
        float value;
        std::memcpy(&value, shard.data, sizeof value);
        value += 0.5f;
        std::memcpy(shard.data, &value, sizeof value);
      }
    }
    ASSERT_TRUE(manager->Save(3, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }
  absl::StatusOr<StepDiff> same = DiffSteps({root_, 1}, {root_, 2});
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_THAT(same->changed, IsEmpty());
  EXPECT_EQ(same->unchanged, 4);

  OperationProgress progress;
  absl::StatusOr<StepDiff> diff =
      DiffSteps({root_, 2}, {root_, 3}, {}, /*values=*/true, &progress);
  ASSERT_TRUE(diff.ok()) << diff.status();
  ASSERT_THAT(NamesOf(*diff), ElementsAre("params/b"));
  const ArrayDiff& changed = diff->changed[0];
  EXPECT_EQ(changed.changed_extents.size(), 1u);
  ASSERT_TRUE(changed.values_compared);
  EXPECT_DOUBLE_EQ(changed.max_abs_diff, 0.5);
  EXPECT_GT(changed.max_rel_diff, 0);
  EXPECT_EQ(progress.done.load(), 2 * 48 * 4);  // params/b, twice
  EXPECT_EQ(progress.total.load(), progress.done.load());
}

TEST_F(ManagerTest, DiffNamesACorruptManifestAndAMissingStep) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
    ASSERT_TRUE(manager->Save(2, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }
  std::ofstream(root_ + "/step_00000002/MANIFEST.json") << "{\"format\": ";
  absl::StatusOr<StepDiff> diff = DiffSteps({root_, 1}, {root_, 2});
  ASSERT_FALSE(diff.ok());
  EXPECT_THAT(diff.status().message(), HasSubstr("step 2 of " + root_));
  EXPECT_THAT(diff.status().message(), HasSubstr("MANIFEST.json"));
  diff = DiffSteps({root_, 1}, {root_, 7});
  ASSERT_FALSE(diff.ok());
  EXPECT_EQ(diff.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace hoist
