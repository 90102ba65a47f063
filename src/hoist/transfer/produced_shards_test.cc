// Shards a ShardProducer makes wave by wave, staged through the
// TransferEngine: one Produce call per wave, every shard asked for once and
// released once, at most one wave of host copies at a time, and a failed
// Produce that stops the staging with nothing held.
#include "hoist/transfer/produced_shards.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "hoist/host_backend.h"
#include "hoist/mutex.h"
#include "testing/array_bytes.h"
#include "testing/copying_producer.h"
#include "testing/mixed_model.h"

namespace hoist {
namespace {

using testing::CopyingProducer;
using ::testing::HasSubstr;

// Receives every extent, copying its bytes out at once.
class KeepingSink final : public StagedExtentSink {
 public:
  void OnStaged(StagedExtent extent) override {
    std::vector<uint8_t> bytes(extent.lease.data(),
                               extent.lease.data() + extent.lease.size_bytes());
    extent.lease.Release();
    MutexLock lock(&mu_);
    staged_[extent.slice] = std::move(bytes);
  }
  std::map<int, std::vector<uint8_t>> Take() {
    MutexLock lock(&mu_);
    return std::move(staged_);
  }

 private:
  Mutex mu_;
  std::map<int, std::vector<uint8_t>> staged_ ABSL_GUARDED_BY(mu_);
};

class ProducedShardsTest : public ::testing::Test {
 protected:
  ProducedShardsTest()
      : model_(testing::SixteenShardedArrays()),
        plan_(*MakeSavePlan(model_, Topology::Uniform(1, 8), {})),
        backend_(*MakeHostBackend({.num_devices = 8})),
        shards_(testing::FillShards(model_, backend_->devices())) {}

  // The sources with every shard of the arrays `produced` says produced.
  ShardSources Sources(const std::vector<bool>& produced) const {
    ShardSources sources;
    for (size_t a = 0; a < shards_.placed.size(); ++a) {
      for (const auto& placed : shards_.placed[a]) {
        sources.Add(static_cast<int>(a), placed.device,
                    produced[a] ? ProducedSource() : placed.data);
      }
    }
    return sources;
  }

  absl::StatusOr<TransferStats> Stage(StagingPool& pool,
                                      const ShardSources& sources,
                                      std::shared_ptr<ShardProducer> producer,
                                      StagedExtentSink& sink) {
    TransferEngine engine(pool);
    absl::StatusOr<std::shared_ptr<const StagingLayout>> layout =
        engine.Lay(plan_, 0, backend_->devices());
    if (!layout.ok()) return layout.status();
    absl::StatusOr<std::unique_ptr<StagingRun>> run =
        engine.Begin(plan_, *layout, backend_->devices(), sources, sink,
                     nullptr, std::move(producer));
    if (!run.ok()) return run.status();
    return engine.Finish(*std::move(run));
  }

  // Stages every shard, each produced, through a pool of `pool_bytes`:
  // every slice's bytes checked, each shard asked for once and released.
  std::pair<TransferStats, std::shared_ptr<CopyingProducer>> StageAllProduced(
      int64_t pool_bytes) {
    auto pool = *StagingPool::Create(*backend_, pool_bytes);
    auto producer = std::make_shared<CopyingProducer>(model_, shards_);
    KeepingSink sink;
    absl::StatusOr<TransferStats> stats =
        Stage(*pool, Sources(std::vector<bool>(16, true)), producer, sink);
    EXPECT_TRUE(stats.ok()) << stats.status();
    ExpectExact(sink.Take());
    EXPECT_EQ(producer->asked(), 16u * 8);
    producer->ExpectAllReleased();
    return {stats.value_or(TransferStats{}), producer};
  }

  void ExpectExact(const std::map<int, std::vector<uint8_t>>& staged) const {
    EXPECT_EQ(staged.size(), plan_.slices.size());
    for (size_t s = 0; s < plan_.slices.size(); ++s) {
      const PlannedSlice& slice = plan_.slices[s];
      auto it = staged.find(static_cast<int>(s));
      ASSERT_NE(it, staged.end()) << "slice " << s;
      EXPECT_TRUE(it->second == testing::BoxBytes(model_[slice.array],
                                                  slice.array, slice.box))
          << model_[slice.array].name << " " << slice.box.ToString();
    }
  }

  std::vector<ArraySpec> model_;
  SavePlan plan_;
  std::unique_ptr<Backend> backend_;
  testing::DeviceShards shards_;
};

TEST_F(ProducedShardsTest, AShareThePoolHoldsIsProducedInOneCall) {
  const auto [stats, producer] = StageAllProduced(4 << 20);
  EXPECT_EQ(stats.waves, 1);
  EXPECT_EQ(producer->calls(), 1);
}

TEST_F(ProducedShardsTest, WavesProduceOneCallEachAndHoldOneWaveAtATime) {
  // 2 MiB of shards through a 64 KiB pool: waves of 32 KiB.
  const auto [stats, producer] = StageAllProduced(64 << 10);
  EXPECT_GT(stats.waves, 1);
  EXPECT_EQ(producer->calls(), stats.waves);
  EXPECT_LE(producer->peak_live_bytes(), 32 << 10);
}

TEST_F(ProducedShardsTest, ProducedAndAddressedShardsStageTogether) {
  std::vector<bool> produced(16);
  for (size_t a = 0; a < produced.size(); a += 3) produced[a] = true;
  auto pool = *StagingPool::Create(*backend_, 64 << 10);
  auto producer = std::make_shared<CopyingProducer>(model_, shards_);
  KeepingSink sink;
  absl::StatusOr<TransferStats> stats =
      Stage(*pool, Sources(produced), producer, sink);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectExact(sink.Take());
  EXPECT_EQ(producer->asked(), 6u * 8);
  EXPECT_LE(producer->calls(), stats->waves);
  producer->ExpectAllReleased();
}

TEST_F(ProducedShardsTest, AFailedProduceStopsStagingAndReleasesWhatItAsked) {
  auto pool = *StagingPool::Create(*backend_, 64 << 10);
  auto producer = std::make_shared<CopyingProducer>(model_, shards_);
  producer->FailCall(2);
  KeepingSink sink;
  absl::StatusOr<TransferStats> stats =
      Stage(*pool, Sources(std::vector<bool>(16, true)), producer, sink);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("for wave 2 of "));
  EXPECT_THAT(stats.status().message(),
              HasSubstr("array deleted on its device"));
  EXPECT_EQ(producer->calls(), 2);  // no wave after the failed one
  producer->ExpectAllReleased();
  sink.Take();
  EXPECT_EQ(pool->stats().in_use_bytes, 0);
}

TEST_F(ProducedShardsTest, AProducedShardWithoutAProducerIsRefused) {
  auto pool = *StagingPool::Create(*backend_, 4 << 20);
  KeepingSink sink;
  absl::StatusOr<TransferStats> stats =
      Stage(*pool, Sources(std::vector<bool>(16, true)), nullptr, sink);
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stats.status().message(), HasSubstr("has no producer"));
  EXPECT_TRUE(sink.Take().empty());
  for (Device* device : backend_->devices()) {
    EXPECT_EQ(device->counters().dispatches, 0);
  }
}

}  // namespace
}  // namespace hoist
