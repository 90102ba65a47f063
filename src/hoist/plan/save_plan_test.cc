#include "hoist/save_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "hoist/base/checked_math.h"
#include "testing/coverage.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

Mesh Mesh2x4() { return *Mesh::Create({"data", "model"}, {2, 4}); }

ArraySpec Named(std::string name, std::vector<int64_t> shape,
                PartitionSpec spec, DType dtype = DType::kFloat32) {
  return {std::move(name), dtype, std::move(shape),
          NamedSharding{Mesh2x4(), std::move(spec)}};
}

// Shapes with primes and odd sizes on a 2 (data) x 4 (model) mesh, over two
// processes of four devices.
std::vector<ArraySpec> AwkwardModel() {
  ExplicitSharding fsdp;  // uneven FSDP rows on devices 0..3
  fsdp.shards = {{0, Box({0, 0}, {3, 5})},
                 {1, Box({3, 0}, {3, 5})},
                 {2, Box({6, 0}, {3, 5})},
                 {3, Box({9, 0}, {1, 5})}};
  ExplicitSharding replicated_pair;  // one box on devices 2 and 6
  replicated_pair.shards = {{2, Box({0}, {37})}, {6, Box({0}, {37})}};
  return {
      Named("prime_rows", {101, 7}, {}),
      Named("prime_cols", {13, 97}, {{}}),
      Named("rows_by_model", {8, 51}, {{"model"}}, DType::kBFloat16),
      Named("odd_by_model", {17, 12}, {{}, {"model"}}),
      Named("scalar", {}, {}, DType::kInt32),
      Named("vector", {1021}, {}, DType::kFloat8E4M3FN),
      Named("by_data", {64, 33}, {{"data"}}),
      Named("both", {6, 8, 3}, {{"data"}, {"model"}}, DType::kFloat64),
      Named("ones", {1, 1, 5}, {}),
      {"fsdp", DType::kFloat32, {10, 5}, fsdp},
      {"pair", DType::kUint16, {37}, replicated_pair},
  };
}

SavePlanOptions Options(ReplicaRule rule, int64_t min_slice_bytes = 0) {
  SavePlanOptions options;
  options.replica_rule = rule;
  options.min_slice_bytes = min_slice_bytes;
  return options;
}

const ReplicaRule kRules[] = {ReplicaRule::kSingleReplica, ReplicaRule::kOrbax,
                              ReplicaRule::kBalanced};

class EveryRuleTest : public ::testing::TestWithParam<ReplicaRule> {};
INSTANTIATE_TEST_SUITE_P(Rules, EveryRuleTest, ::testing::ValuesIn(kRules),
                         [](const auto& info) {
                           return std::string(ReplicaRuleName(info.param));
                         });

TEST_P(EveryRuleTest, SlicesTileEveryArrayExactlyOnce) {
  const std::vector<ArraySpec> model = AwkwardModel();
  for (int64_t min_slice : {int64_t{0}, int64_t{64}, int64_t{1} << 20}) {
    absl::StatusOr<SavePlan> plan = MakeSavePlan(
        model, Topology::Uniform(2, 4), Options(GetParam(), min_slice));
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int a = 0; a < static_cast<int>(model.size()); ++a) {
      std::vector<Box> boxes;
      for (const PlannedSlice& slice : plan->slices) {
        if (slice.array == a) boxes.push_back(slice.box);
      }
      for (int c : testing::Coverage(boxes, model[a].shape)) {
        ASSERT_EQ(c, 1) << model[a].name << " min_slice=" << min_slice;
      }
    }
  }
}

TEST_P(EveryRuleTest, EachSliceIsCopiedByADeviceHoldingItsShard) {
  const std::vector<ArraySpec> model = AwkwardModel();
  const Topology topology = Topology::Uniform(2, 4);
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan(model, topology, Options(GetParam()));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedSlice& slice : plan->slices) {
    const ShardLayout layout =
        *model[slice.array].sharding.Layout(model[slice.array].shape);
    bool holds = false;
    for (const DeviceShard& shard : layout.shards) {
      if (shard.device == slice.device && shard.box == slice.shard_box) {
        holds = true;
      }
    }
    EXPECT_TRUE(holds) << model[slice.array].name << " " << slice.box.ToString()
                       << " on " << slice.device;
    EXPECT_TRUE(slice.shard_box.Contains(slice.box));
    EXPECT_EQ(slice.process, *topology.ProcessOf(slice.device));
    EXPECT_EQ(slice.length_bytes,
              slice.box.num_elements() * ItemSize(model[slice.array].dtype));
  }
}

// Runs each slice's 2-D copy over its shard's row-major buffer and checks the
// result is the slice box in C order.
TEST_P(EveryRuleTest, SliceCopyGathersTheSliceInCOrder) {
  const std::vector<ArraySpec> model = AwkwardModel();
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan(model, Topology::Uniform(2, 4), Options(GetParam()));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedSlice& slice : plan->slices) {
    const ArraySpec& spec = model[slice.array];
    const int64_t item = ItemSize(spec.dtype);
    // Element values are their global flat index, stored in `item` bytes.
    auto fill = [&](const Box& box) {
      std::vector<uint8_t> bytes;
      testing::ForEachIndex(box, spec.shape, [&](int64_t flat) {
        uint64_t value = static_cast<uint64_t>(flat);
        const size_t at = bytes.size();
        bytes.resize(at + item);
        std::memcpy(&bytes[at], &value, item);
      });
      return bytes;
    };
    const std::vector<uint8_t> shard = fill(slice.shard_box);
    const SliceCopy& copy = slice.copy;
    ASSERT_EQ(copy.rows * copy.width_bytes, slice.length_bytes);
    std::vector<uint8_t> staged(slice.length_bytes);
    for (int64_t r = 0; r < copy.rows; ++r) {
      const int64_t src = copy.src_offset_bytes + r * copy.src_pitch_bytes;
      ASSERT_LE(src + copy.width_bytes, static_cast<int64_t>(shard.size()));
      std::memcpy(&staged[r * copy.width_bytes], &shard[src], copy.width_bytes);
    }
    EXPECT_EQ(staged, fill(slice.box))
        << spec.name << " " << slice.box.ToString();
  }
}

TEST_P(EveryRuleTest, ExtentsAreAlignedAndDisjointInTheirProcessFiles) {
  SavePlanOptions options = Options(GetParam());
  options.writer_streams = 3;
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan(AwkwardModel(), Topology::Uniform(2, 4), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->files.size(), 6u);
  EXPECT_EQ(plan->files[4].process, 1);
  EXPECT_EQ(plan->files[4].stream, 1);
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> extents;
  for (const PlannedSlice& slice : plan->slices) {
    EXPECT_EQ(slice.offset_bytes % 4096, 0);
    EXPECT_EQ(plan->files[slice.file].process, slice.process);
    extents[slice.file].emplace_back(slice.offset_bytes,
                                     slice.offset_bytes + slice.length_bytes);
  }
  for (auto& [file, ranges] : extents) {
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      EXPECT_LE(ranges[i - 1].second, ranges[i].first);
    }
    EXPECT_EQ(plan->files[file].size_bytes, ranges.back().second);
  }
}

TEST_P(EveryRuleTest, SameInputGivesIdenticalPlan) {
  const Topology topology = Topology::Uniform(2, 4);
  absl::StatusOr<SavePlan> a =
      MakeSavePlan(AwkwardModel(), topology, Options(GetParam(), 64));
  absl::StatusOr<SavePlan> b = MakeSavePlan(
      AwkwardModel(), Topology::Uniform(2, 4), Options(GetParam(), 64));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
}

TEST(SavePlanTest, SingleReplicaSavesEachBoxWholeOnReplicaZero) {
  absl::StatusOr<SavePlan> plan = MakeSavePlan(
      {Named("w", {8, 16}, {{}, {"model"}})}, Topology::Uniform(2, 4),
      Options(ReplicaRule::kSingleReplica));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->slices.size(), 4u);
  for (const PlannedSlice& slice : plan->slices) {
    EXPECT_EQ(slice.box, slice.shard_box);
    EXPECT_LT(slice.device, 4);  // data=0 row of the mesh
  }
  EXPECT_TRUE(plan->arrays[0].unsplit);
}

TEST(SavePlanTest, OrbaxSplitsAlongFirstDivisibleAxis) {
  // (5, 4) replicated twice: axis 0 (5) does not divide, axis 1 does.
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan({{"w",
                     DType::kFloat32,
                     {5, 4},
                     ExplicitSharding{{{0, Box({0, 0}, {5, 4})},
                                       {1, Box({0, 0}, {5, 4})}}}}},
                   Topology::Uniform(1, 2), Options(ReplicaRule::kOrbax));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->slices.size(), 2u);
  EXPECT_EQ(plan->slices[0].box, Box({0, 0}, {5, 2}));
  EXPECT_EQ(plan->slices[0].device, 0);
  EXPECT_EQ(plan->slices[1].box, Box({0, 2}, {5, 2}));
  EXPECT_EQ(plan->slices[1].device, 1);
  EXPECT_EQ(plan->slices[1].copy, (SliceCopy{.src_offset_bytes = 8,
                                             .src_pitch_bytes = 16,
                                             .width_bytes = 8,
                                             .rows = 5}));
}

TEST(SavePlanTest, OrbaxLeavesBoxWithoutDivisibleAxisUnsplit) {
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan({Named("w", {5, 3}, {})}, Topology::Uniform(2, 4),
                   Options(ReplicaRule::kOrbax));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->slices.size(), 1u);
  EXPECT_EQ(plan->slices[0].device, 0);
  EXPECT_TRUE(plan->arrays[0].unsplit);
}

TEST(SavePlanTest, BalancedSplitsUnevenlyAlongAxisZero) {
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan({Named("w", {5, 3}, {{}, {}})}, Topology::Uniform(1, 8),
                   Options(ReplicaRule::kBalanced));
  ASSERT_TRUE(plan.ok());
  // 8 replicas but only 5 rows: five contiguous one-row slices.
  ASSERT_EQ(plan->slices.size(), 5u);
  for (const PlannedSlice& slice : plan->slices) {
    EXPECT_EQ(slice.box.shape()[0], 1);
    EXPECT_EQ(slice.copy.rows, 1);
  }
  EXPECT_FALSE(plan->arrays[0].unsplit);
}

TEST(SavePlanTest, BalancedPrefersContiguousAxisZeroOverDivisibleAxis) {
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan({Named("w", {7, 8}, {})}, Topology::Uniform(2, 4),
                   Options(ReplicaRule::kBalanced));
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->slices.size(), 7u);  // capped by the 7 rows
  EXPECT_EQ(Summarize(*plan, Topology::Uniform(2, 4)).strided_slices, 0);
}

TEST(SavePlanTest, MinSliceBytesLimitsSliceCount) {
  // 64 rows x 256 B = 16 KiB, 8 replicas, slices >= 4 KiB: 4 slices.
  absl::StatusOr<SavePlan> balanced =
      MakeSavePlan({Named("w", {64, 64}, {})}, Topology::Uniform(2, 4),
                   Options(ReplicaRule::kBalanced, 4096));
  ASSERT_TRUE(balanced.ok());
  EXPECT_EQ(balanced->slices.size(), 4u);
  // Orbax needs 16 KiB / 8 >= 4 KiB and so leaves it whole.
  absl::StatusOr<SavePlan> orbax =
      MakeSavePlan({Named("w", {64, 64}, {})}, Topology::Uniform(2, 4),
                   Options(ReplicaRule::kOrbax, 4096));
  ASSERT_TRUE(orbax.ok());
  EXPECT_EQ(orbax->slices.size(), 1u);
}

// A model's small arrays (biases, norms) between its large ones: every
// file holds its small slices first, one after another in slice order, then
// its large ones, each at the next aligned offset.
TEST(SavePlanTest, SmallSlicesComeFirstInEachFileInOrder) {
  std::vector<ArraySpec> model;
  for (int layer = 0; layer < 6; ++layer) {
    model.push_back(Named(absl::StrCat("w", layer), {512, 512}, {{"data"}}));
    model.push_back(Named(absl::StrCat("b", layer), {512}, {}));
    model.push_back(Named(absl::StrCat("norm", layer), {64, 512}, {}));
  }
  SavePlanOptions options;
  options.writer_streams = 2;
  absl::StatusOr<SavePlan> plan =
      MakeSavePlan(model, Topology::Uniform(1, 8), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int f = 0; f < static_cast<int>(plan->files.size()); ++f) {
    SCOPED_TRACE(f);
    int64_t end = 0;
    int small = 0, large = 0;
    for (const PlannedSlice& slice : plan->slices) {  // slice order
      if (slice.file != f || slice.length_bytes >= kSmallSliceBytes) continue;
      EXPECT_EQ(slice.offset_bytes, AlignUp(end, 4096)) << slice.array;
      end = slice.offset_bytes + slice.length_bytes;
      ++small;
    }
    for (const PlannedSlice& slice : plan->slices) {
      if (slice.file != f || slice.length_bytes < kSmallSliceBytes) continue;
      EXPECT_EQ(slice.offset_bytes, AlignUp(end, 4096)) << slice.array;
      end = slice.offset_bytes + slice.length_bytes;
      ++large;
    }
    EXPECT_GT(small, 1);
    EXPECT_GT(large, 1);
    EXPECT_EQ(plan->files[f].size_bytes, end);
  }
}

TEST(SavePlanTest, MaxReplicasCapsSlices) {
  SavePlanOptions options = Options(ReplicaRule::kOrbax);
  options.max_replicas = 2;
  absl::StatusOr<SavePlan> plan = MakeSavePlan(
      {Named("w", {64, 64}, {})}, Topology::Uniform(2, 4), options);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->slices.size(), 2u);
  EXPECT_EQ(plan->slices[0].device, 0);
  EXPECT_EQ(plan->slices[1].device, 1);
  options.replica_rule = ReplicaRule::kBalanced;
  EXPECT_EQ(
      MakeSavePlan({Named("w", {64, 64}, {})}, Topology::Uniform(2, 4), options)
          ->slices.size(),
      2u);
}

// Many arrays with awkward shapes, each replicated 2 or 8 times.
std::vector<ArraySpec> RandomReplicatedModel(int arrays, uint32_t seed) {
  std::mt19937 rng(seed);
  const int primes[] = {3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 509, 1021};
  std::vector<ArraySpec> model;
  for (int i = 0; i < arrays; ++i) {
    std::vector<int64_t> shape = {primes[rng() % 12], primes[rng() % 12]};
    if (rng() % 2) {
      shape[1] *= 4;  // divisible by the model axis
      model.push_back(Named("a" + std::to_string(i), shape, {{}, {"model"}}));
    } else {
      model.push_back(Named("a" + std::to_string(i), shape, {}));
    }
  }
  return model;
}

TEST(SavePlanTest, BalancedRuleBalancesDevicesAndProcesses) {
  const Topology topology = Topology::Uniform(2, 4);
  const std::vector<ArraySpec> model = RandomReplicatedModel(300, 11);
  absl::StatusOr<SavePlan> balanced =
      MakeSavePlan(model, topology, Options(ReplicaRule::kBalanced, 4096));
  absl::StatusOr<SavePlan> orbax =
      MakeSavePlan(model, topology, Options(ReplicaRule::kOrbax, 4096));
  ASSERT_TRUE(balanced.ok() && orbax.ok());
  const PlanSummary b = Summarize(*balanced, topology);
  const PlanSummary o = Summarize(*orbax, topology);
  EXPECT_EQ(b.total_bytes, o.total_bytes);
  EXPECT_LE(b.max_device_bytes, 1.05 * b.mean_device_bytes);
  EXPECT_LE(b.max_process_bytes, 1.05 * b.mean_process_bytes);
  EXPECT_LT(b.max_device_bytes, o.max_device_bytes);
  EXPECT_LE(b.unsplit_arrays, o.unsplit_arrays);
}

// A part (the local tier's) holds every byte its process's devices hold,
// once, saved by that process's devices only, and nothing else.
TEST(SavePlanTest, PartOfProcessSavesExactlyWhatThatProcessHolds) {
  const std::vector<ArraySpec> model = AwkwardModel();
  const Topology topology = Topology::Uniform(2, 4);
  for (ReplicaRule rule : kRules) {
    for (int process : {0, 1}) {
      SavePlanOptions options = Options(rule);
      options.part_of_process = process;
      absl::StatusOr<SavePlan> plan = MakeSavePlan(model, topology, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<int64_t> saved(model.size(), 0), held(model.size(), 0);
      for (const PlannedSlice& slice : plan->slices) {
        EXPECT_EQ(slice.process, process);
        EXPECT_EQ(slice.device / 4, process);
        saved[slice.array] += slice.box.num_elements();
        // Inside a box the process holds.
        const ShardLayout layout =
            *model[slice.array].sharding.Layout(model[slice.array].shape);
        EXPECT_TRUE(absl::c_any_of(layout.unique_boxes, [&](const auto& u) {
          return u.box.Contains(slice.box) &&
                 absl::c_linear_search(u.devices, slice.device);
        }));
      }
      for (size_t a = 0; a < model.size(); ++a) {
        const ShardLayout layout = *model[a].sharding.Layout(model[a].shape);
        for (const UniqueBox& unique : layout.unique_boxes) {
          if (absl::c_any_of(unique.devices,
                             [&](DeviceId d) { return d / 4 == process; })) {
            held[a] += unique.box.num_elements();
          }
        }
        // Slices are disjoint (a plan's invariant), so equal counts mean
        // every held element is saved exactly once.
        EXPECT_EQ(saved[a], held[a])
            << model[a].name << " rule " << ReplicaRuleName(rule);
      }
    }
  }
  SavePlanOptions bad;
  bad.part_of_process = 2;
  EXPECT_EQ(MakeSavePlan(model, topology, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SavePlanTest, SummaryCountsDispatches) {
  const Topology topology = Topology::Uniform(2, 4);
  absl::StatusOr<SavePlan> plan = MakeSavePlan(
      {Named("w", {8, 16}, {{}, {"model"}}), Named("b", {16}, {{"model"}})},
      topology, Options(ReplicaRule::kBalanced));
  ASSERT_TRUE(plan.ok());
  const PlanSummary summary = Summarize(*plan, topology);
  // Each of the 8 boxes (4 per array) splits over its 2 replicas.
  EXPECT_EQ(summary.slices, 16);
  EXPECT_EQ(summary.dispatches_per_slice, 16);
  EXPECT_EQ(summary.dispatches_batched, 8);
  EXPECT_EQ(summary.total_bytes, (8 * 16 + 16) * 4);
  EXPECT_EQ(summary.replicated_arrays, 2);
  EXPECT_EQ(summary.unsplit_arrays, 0);
}

TEST(SavePlanTest, RejectsEmptyAndDuplicateNames) {
  const Topology topology = Topology::Uniform(1, 8);
  EXPECT_THAT(MakeSavePlan({Named("", {4}, {})}, topology).status().message(),
              HasSubstr("empty name"));
  EXPECT_THAT(MakeSavePlan({Named("w", {4}, {}), Named("w", {4}, {})}, topology)
                  .status()
                  .message(),
              HasSubstr("'w' appears more than once"));
}

// A manifest is JSON: a name it cannot carry would commit a step no reader
// can decode.
TEST(SavePlanTest, RejectsNamesThatAreNotUtf8AndRanksAboveTheLimit) {
  const Topology topology = Topology::Uniform(1, 8);
  absl::Status status =
      MakeSavePlan({Named("caf\xe9", {4}, {})}, topology).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not valid UTF-8"));
  status =
      MakeSavePlan({Named("deep", std::vector<int64_t>(kMaxRank + 1, 1), {})},
                   topology)
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("rank 65"));
}

TEST(SavePlanTest, InvalidShardingErrorNamesTheArray) {
  absl::Status status = MakeSavePlan({Named("embed", {50257, 8}, {{"model"}})},
                                     Topology::Uniform(2, 4))
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("array 'embed': dimension 0"));
}

TEST(SavePlanTest, ArraysOfOneShapeAndSpecOnTwoMeshesKeepTheirOwnDevices) {
  // Layouts are resolved once per (shape, sharding): two meshes that differ
  // only in their devices must not share one.
  const Mesh low = *Mesh::Create({"x"}, {4}, {0, 1, 2, 3});
  const Mesh high = *Mesh::Create({"x"}, {4}, {4, 5, 6, 7});
  std::vector<ArraySpec> specs;
  for (int i = 0; i < 3; ++i) {
    specs.push_back({absl::StrCat("low", i),
                     DType::kFloat32,
                     {8, 4},
                     NamedSharding{low, {{"x"}}}});
    specs.push_back({absl::StrCat("high", i),
                     DType::kFloat32,
                     {8, 4},
                     NamedSharding{high, {{"x"}}}});
  }
  absl::StatusOr<SavePlan> plan = MakeSavePlan(specs, Topology::Uniform(2, 4));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const PlannedSlice& slice : plan->slices) {
    const bool is_low = plan->arrays[slice.array].name.starts_with("low");
    EXPECT_EQ(slice.device < 4, is_low) << plan->arrays[slice.array].name;
    EXPECT_EQ(slice.process, is_low ? 0 : 1);
  }
}

TEST(SavePlanTest, DeviceOutsideTopologyIsRejected) {
  absl::Status status =
      MakeSavePlan({Named("w", {8}, {})}, Topology::Uniform(1, 4)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("array 'w': device 4 is not owned"));
}

TEST(SavePlanTest, ByteOverflowIsRejected) {
  absl::Status status =
      MakeSavePlan({Named("huge", {int64_t{1} << 31, int64_t{1} << 31}, {},
                          DType::kFloat64)},
                   Topology::Uniform(2, 4))
          .status();
  EXPECT_THAT(status.message(), HasSubstr("array 'huge'"));
  EXPECT_THAT(status.message(), HasSubstr("overflows"));
}

TEST(SavePlanTest, InvalidOptionsAreRejected) {
  const Topology topology = Topology::Uniform(1, 1);
  SavePlanOptions options;
  options.writer_streams = 0;
  EXPECT_THAT(MakeSavePlan({}, topology, options).status().message(),
              HasSubstr("writer_streams"));
  options = {};
  options.alignment_bytes = 3000;
  EXPECT_THAT(MakeSavePlan({}, topology, options).status().message(),
              HasSubstr("power of two"));
  options.alignment_bytes = 512;  // readers require 4 KiB-aligned extents
  EXPECT_THAT(MakeSavePlan({}, topology, options).status().message(),
              HasSubstr(">= 4096"));
  options = {};
  options.min_slice_bytes = -1;
  EXPECT_FALSE(MakeSavePlan({}, topology, options).ok());
}

TEST(SavePlanTest, ReplicaRuleNamesRoundTrip) {
  for (ReplicaRule rule : kRules) {
    EXPECT_EQ(*ParseReplicaRule(ReplicaRuleName(rule)), rule);
  }
  EXPECT_FALSE(ParseReplicaRule("fastest").ok());
}

}  // namespace
}  // namespace hoist
