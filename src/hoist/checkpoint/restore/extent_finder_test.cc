#include "hoist/checkpoint/restore/extent_finder.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

ManifestExtent ExtentAt(std::vector<int64_t> origin,
                        std::vector<int64_t> shape) {
  ManifestExtent extent;
  extent.box = Box(std::move(origin), std::move(shape));
  return extent;
}

// Array 0: 8x4 in rows of 2 (extents 0-3); array 1: a scalar (extent 4);
// array 2: 10 elements in an uneven tiling 0-6, 6-7, 7-10 (extents 5-7).
Manifest ThreeArrays() {
  Manifest manifest;
  ManifestArray rows;
  rows.shape = {8, 4};
  for (int64_t r = 0; r < 8; r += 2) {
    rows.extents.push_back(ExtentAt({r, 0}, {2, 4}));
  }
  ManifestArray scalar;
  scalar.extents.push_back(ExtentAt({}, {}));
  ManifestArray uneven;
  uneven.shape = {10};
  uneven.extents = {ExtentAt({0}, {6}), ExtentAt({6}, {1}), ExtentAt({7}, {3})};
  manifest.arrays = {rows, scalar, uneven};
  return manifest;
}

TEST(ExtentFinderTest, FindsTheExtentsABoxMeetsByFlatId) {
  const Manifest manifest = ThreeArrays();
  const std::vector<int64_t> first_id = {0, 4, 5};
  const ExtentFinder finder(manifest, first_id);
  std::vector<int64_t> ids;
  finder.Find(0, Box({3, 1}, {3, 2}), ids);  // rows 3-5 meet extents 1, 2
  EXPECT_THAT(ids, ElementsAre(1, 2));
  ids.clear();
  finder.Find(1, Box({}, {}), ids);
  EXPECT_THAT(ids, ElementsAre(4));
}

TEST(ExtentFinderTest, ReachesBackToAWideExtentThatStartsBeforeTheBox) {
  const Manifest manifest = ThreeArrays();
  const std::vector<int64_t> first_id = {0, 4, 5};
  const ExtentFinder finder(manifest, first_id);
  std::vector<int64_t> ids;
  finder.Find(2, Box({5}, {2}), ids);  // 5-7: inside 0-6 and 6-7
  EXPECT_THAT(ids, ElementsAre(5, 6));
}

TEST(ExtentFinderTest, ABoxOutsideEveryExtentMeetsNone) {
  const Manifest manifest = ThreeArrays();
  const std::vector<int64_t> first_id = {0, 4, 5};
  const ExtentFinder finder(manifest, first_id);
  std::vector<int64_t> ids;
  finder.Find(0, Box({8, 0}, {2, 4}), ids);
  EXPECT_THAT(ids, IsEmpty());
}

}  // namespace
}  // namespace hoist
