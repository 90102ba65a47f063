#include <gtest/gtest.h>

#include <random>

#include "hoist/box.h"
#include "testing/coverage.h"

namespace hoist {
namespace {

// A buffer holding `box` of a global array whose element at flat index f
// (in `shape`) is f, as int32.
std::vector<int32_t> Fill(const Box& box, const std::vector<int64_t>& shape) {
  std::vector<int32_t> out;
  testing::ForEachIndex(box, shape, [&](int64_t flat) {
    out.push_back(static_cast<int32_t>(flat));
  });
  return out;
}

TEST(CopyBoxTest, CopiesRandomRegionsBetweenRandomBoxes) {
  std::mt19937 rng(3);
  const std::vector<int64_t> shape = {7, 9, 5};
  auto random_box = [&](const Box& within) {
    std::vector<int64_t> origin(3), size(3);
    for (int d = 0; d < 3; ++d) {
      const int64_t lo = within.origin()[d] + rng() % within.shape()[d];
      const int64_t hi = lo + 1 + rng() % (within.limit(d) - lo);
      origin[d] = lo;
      size[d] = hi - lo;
    }
    return Box(origin, size);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const Box region = random_box(Box::FromShape(shape));
    // Boxes containing region: grow it randomly towards the array bounds.
    auto around = [&] {
      std::vector<int64_t> origin(3), size(3);
      for (int d = 0; d < 3; ++d) {
        origin[d] = rng() % (region.origin()[d] + 1);
        const int64_t limit =
            region.limit(d) + rng() % (shape[d] - region.limit(d) + 1);
        size[d] = limit - origin[d];
      }
      return Box(origin, size);
    };
    const Box src_box = around(), dst_box = around();
    const std::vector<int32_t> src = Fill(src_box, shape);
    std::vector<int32_t> dst(dst_box.num_elements(), -1);
    CopyBox(reinterpret_cast<const uint8_t*>(src.data()), src_box,
            reinterpret_cast<uint8_t*>(dst.data()), dst_box, region, 4);
    // Inside region: the global index; elsewhere untouched.
    size_t i = 0;
    testing::ForEachIndex(dst_box, shape, [&](int64_t flat) {
      std::vector<int64_t> idx(3);
      int64_t rest = flat;
      for (int d = 2; d >= 0; --d) {
        idx[d] = rest % shape[d];
        rest /= shape[d];
      }
      const int32_t expected =
          region.ContainsIndex(idx) ? static_cast<int32_t>(flat) : -1;
      ASSERT_EQ(dst[i], expected) << "trial " << trial;
      ++i;
    });
  }
}

TEST(CopyBoxTest, ScalarCopiesOneElement) {
  const uint8_t src[2] = {7, 9};
  uint8_t dst[2] = {0, 0};
  CopyBox(src, Box(), dst, Box(), Box(), 2);
  EXPECT_EQ(dst[0], 7);
  EXPECT_EQ(dst[1], 9);
}

}  // namespace
}  // namespace hoist
