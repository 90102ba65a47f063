#include "hoist/checkpoint/save/host_memory.h"

#include <gtest/gtest.h>

#include <memory>

#include "hoist/host_backend.h"

namespace hoist {
namespace {

// The overflow grows to what a save needs, up to its limit, is kept for the
// saves after, and gives way to a smaller one where a save caps it (a save
// whose shards a producer makes leaves room for their host copies).
TEST(StagingOverflowTest, GrowsToTheNeedIsKeptAndShrinksToACap) {
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 1});
  StagingOverflow overflow(*backend, 1 << 20);
  EXPECT_EQ(overflow.Reserve(0), nullptr);
  StagingPool* first = overflow.Reserve(256 << 10);
  ASSERT_NE(first, nullptr);
  EXPECT_GE(first->capacity_bytes(), 256 << 10);
  EXPECT_EQ(overflow.Reserve(128 << 10), first);  // kept
  StagingPool* grown = overflow.Reserve(4 << 20);
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(grown->capacity_bytes(), 1 << 20);  // the limit
  StagingPool* capped = overflow.Reserve(128 << 10, 512 << 10);
  ASSERT_NE(capped, nullptr);
  EXPECT_GE(capped->capacity_bytes(), 128 << 10);
  EXPECT_LE(capped->capacity_bytes(), 512 << 10);
  EXPECT_EQ(overflow.Reserve(128 << 10, 512 << 10), capped);  // kept
  EXPECT_EQ(overflow.Reserve(128 << 10, 0), nullptr);         // none allowed
  EXPECT_TRUE(overflow.last_error().ok());
}

}  // namespace
}  // namespace hoist
