#include "hoist/sharding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "testing/coverage.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Mesh Mesh2x4() { return *Mesh::Create({"data", "model"}, {2, 4}); }

std::vector<int> Coverage(const ShardLayout& layout,
                          const std::vector<int64_t>& shape) {
  std::vector<Box> boxes;
  for (const UniqueBox& unique : layout.unique_boxes)
    boxes.push_back(unique.box);
  return testing::Coverage(boxes, shape);
}

TEST(NamedShardingTest, ModelAxisShardsColumnsAndDataAxisReplicates) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{}, {"model"}}};
  absl::StatusOr<ShardLayout> layout = sharding.Layout({8, 16});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->shards.size(), 8u);
  // Device 5 sits at mesh coords (data=1, model=1).
  EXPECT_EQ(layout->shards[5].device, 5);
  EXPECT_EQ(layout->shards[5].box, Box({0, 4}, {8, 4}));
  EXPECT_EQ(layout->shards[5].replica_id, 1);
  EXPECT_EQ(layout->shards[1].replica_id, 0);
  ASSERT_EQ(layout->unique_boxes.size(), 4u);
  EXPECT_EQ(layout->unique_boxes[1].box, Box({0, 4}, {8, 4}));
  EXPECT_THAT(layout->unique_boxes[1].devices, ElementsAre(1, 5));
}

TEST(NamedShardingTest, SeveralMeshAxesOnOneDimAreMajorToMinor) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{"data", "model"}}};
  absl::StatusOr<ShardLayout> layout = sharding.Layout({16});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->unique_boxes.size(), 8u);
  // Position 6 = (data=1, model=2) -> index 1 * 4 + 2 = 6.
  EXPECT_EQ(layout->shards[6].box, Box({12}, {2}));
  // Reversed axes: index = model * 2 + data = 2 * 2 + 1 = 5.
  Sharding reversed = NamedSharding{Mesh2x4(), {{"model", "data"}}};
  EXPECT_EQ(reversed.Layout({16})->shards[6].box, Box({10}, {2}));
}

TEST(NamedShardingTest, FullyReplicatedHasOneBoxWithEveryDevice) {
  absl::StatusOr<ShardLayout> layout =
      Sharding::Replicated(Mesh2x4()).Layout({3, 5});
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->unique_boxes.size(), 1u);
  EXPECT_EQ(layout->unique_boxes[0].box, Box({0, 0}, {3, 5}));
  EXPECT_EQ(layout->unique_boxes[0].replicas(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(layout->shards[i].replica_id, i);
}

TEST(NamedShardingTest, ScalarIsReplicated) {
  absl::StatusOr<ShardLayout> layout =
      Sharding::Replicated(Mesh2x4()).Layout({});
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->unique_boxes.size(), 1u);
  EXPECT_EQ(layout->unique_boxes[0].box, Box());
}

TEST(NamedShardingTest, CustomDeviceIdsAppearInLayout) {
  Mesh mesh = *Mesh::Create({"x"}, {2}, {10, 3});
  absl::StatusOr<ShardLayout> layout =
      Sharding(NamedSharding{mesh, {{"x"}}}).Layout({4});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->shards[0].device, 10);
  EXPECT_EQ(layout->shards[1].device, 3);
  EXPECT_EQ(layout->shards[1].box, Box({2}, {2}));
}

TEST(NamedShardingTest, UniqueBoxesTileEveryShapeExactlyOnce) {
  std::mt19937 rng(7);
  Mesh mesh = *Mesh::Create({"a", "b", "c"}, {2, 3, 2});
  const std::vector<PartitionSpec> specs = {
      {},
      {{"a"}},
      {{"b"}, {"a", "c"}},
      {{}, {"c"}, {"b"}},
      {{"c", "b", "a"}},
      {{"a"}, {"b"}, {"c"}},
  };
  for (const PartitionSpec& spec : specs) {
    for (int trial = 0; trial < 5; ++trial) {
      // Multiples of 12 divide by any product of mesh axes.
      std::vector<int64_t> shape = {12 * (1 + static_cast<int>(rng() % 2)),
                                    12 * (1 + static_cast<int>(rng() % 3)), 12};
      Sharding sharding = NamedSharding{mesh, spec};
      absl::StatusOr<ShardLayout> layout = sharding.Layout(shape);
      ASSERT_TRUE(layout.ok()) << layout.status();
      for (int c : Coverage(*layout, shape)) ASSERT_EQ(c, 1);
      // Every device's box is one of the unique boxes.
      for (const DeviceShard& shard : layout->shards) {
        bool found = false;
        for (const UniqueBox& u : layout->unique_boxes) {
          if (u.box == shard.box) {
            EXPECT_EQ(u.devices[shard.replica_id], shard.device);
            found = true;
          }
        }
        EXPECT_TRUE(found) << shard.box.ToString();
      }
    }
  }
}

TEST(NamedShardingTest, NotDivisibleNamesDimensionAndAxes) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{"model"}, {}}};
  absl::Status status = sharding.Layout({50257, 8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("dimension 0"));
  EXPECT_THAT(status.message(), HasSubstr("50257"));
  EXPECT_THAT(status.message(), HasSubstr("not divisible by the 4 parts"));
}

TEST(NamedShardingTest, UnknownMeshAxis) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{"pipe"}}};
  absl::Status status = sharding.Layout({8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("mesh axis 'pipe'"));
}

TEST(NamedShardingTest, ReusedMeshAxis) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{"model"}, {"data", "model"}}};
  absl::Status status = sharding.Layout({8, 8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("uses mesh axis 'model' twice (dimensions 0 and 1)"));
}

TEST(NamedShardingTest, SpecLongerThanRankIsRankMismatch) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{}, {"model"}}};
  absl::Status status = sharding.Layout({8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("rank mismatch"));
}

TEST(NamedShardingTest, OverflowingShapeIsRejected) {
  absl::Status status = Sharding::Replicated(Mesh2x4())
                            .Layout({int64_t{1} << 40, int64_t{1} << 40})
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

ExplicitSharding RowShards(int devices, int64_t rows, int64_t cols) {
  ExplicitSharding sharding;
  const int64_t per = rows / devices;
  for (int d = 0; d < devices; ++d) {
    sharding.shards.push_back({d, Box({d * per, 0}, {per, cols})});
  }
  return sharding;
}

TEST(ExplicitShardingTest, DisjointRowShardsTile) {
  absl::StatusOr<ShardLayout> layout =
      Sharding(RowShards(4, 8, 3)).Layout({8, 3});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->unique_boxes.size(), 4u);
  for (int c : Coverage(*layout, {8, 3})) EXPECT_EQ(c, 1);
}

TEST(ExplicitShardingTest, IdenticalBoxesAreReplicasInListingOrder) {
  ExplicitSharding sharding;
  sharding.shards = {{7, Box({0}, {4})},
                     {2, Box({4}, {4})},
                     {3, Box({0}, {4})},
                     {9, Box({4}, {4})}};
  absl::StatusOr<ShardLayout> layout = Sharding(sharding).Layout({8});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->unique_boxes.size(), 2u);
  EXPECT_THAT(layout->unique_boxes[0].devices, ElementsAre(7, 3));
  EXPECT_EQ(layout->shards[2].replica_id, 1);
}

TEST(ExplicitShardingTest, UnevenFsdpShardsWithAnEmptyOneAreAccepted) {
  ExplicitSharding sharding;
  sharding.shards = {{0, Box({0}, {3})},
                     {1, Box({3}, {3})},
                     {2, Box({6}, {1})},
                     {3, Box({7}, {0})}};
  absl::StatusOr<ShardLayout> layout = Sharding(sharding).Layout({7});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->unique_boxes.size(), 3u);  // the empty box holds nothing
}

TEST(ExplicitShardingTest, OverlapIsRejectedNamingBothBoxes) {
  ExplicitSharding sharding;
  sharding.shards = {{0, Box({0}, {5})}, {1, Box({4}, {4})}};
  absl::Status status = Sharding(sharding).Layout({8}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("[0:5] (device 0) and [4:8]"));
  EXPECT_THAT(status.message(), HasSubstr("overlap"));
}

TEST(ExplicitShardingTest, GapIsRejected) {
  ExplicitSharding sharding;
  sharding.shards = {{0, Box({0, 0}, {2, 4})}, {1, Box({2, 0}, {1, 4})}};
  absl::Status status = Sharding(sharding).Layout({4, 4}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("gap"));
  EXPECT_THAT(status.message(), HasSubstr("cover 12 of the 16"));
}

TEST(ExplicitShardingTest, WrongRankOutsideAndDuplicateDevice) {
  ExplicitSharding wrong_rank;
  wrong_rank.shards = {{0, Box({0}, {4})}};
  EXPECT_THAT(Sharding(wrong_rank).Layout({4, 1}).status().message(),
              HasSubstr("rank mismatch"));

  ExplicitSharding outside;
  outside.shards = {{0, Box({2}, {4})}};
  EXPECT_THAT(Sharding(outside).Layout({4}).status().message(),
              HasSubstr("outside the array"));

  ExplicitSharding duplicate;
  duplicate.shards = {{0, Box({0}, {2})}, {0, Box({2}, {2})}};
  EXPECT_THAT(Sharding(duplicate).Layout({4}).status().message(),
              HasSubstr("device 0 more than once"));

  EXPECT_THAT(Sharding(ExplicitSharding{}).Layout({4}).status().message(),
              HasSubstr("no shards"));
}

TEST(ExplicitShardingTest, ScalarReplicas) {
  ExplicitSharding sharding;
  sharding.shards = {{0, Box()}, {1, Box()}};
  absl::StatusOr<ShardLayout> layout = Sharding(sharding).Layout({});
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->unique_boxes.size(), 1u);
  EXPECT_EQ(layout->unique_boxes[0].replicas(), 2);
}

TEST(ShardingTest, ToStringLooksLikeJax) {
  Sharding sharding = NamedSharding{Mesh2x4(), {{}, {"data", "model"}}};
  EXPECT_EQ(sharding.ToString(),
            "Named(Mesh(data=2, model=4), P(None, ('data', 'model')))");
  EXPECT_EQ(Sharding(RowShards(2, 4, 1)).ToString(), "Explicit(2 shards)");
}

}  // namespace
}  // namespace hoist
