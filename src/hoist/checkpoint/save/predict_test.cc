#include "hoist/predict.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "hoist/host_backend.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;

// 400 MB of uint8 sharded over the 4 devices of 2 processes: 100 MB each.
SavePlan FourShards(const Topology& topology) {
  const Mesh mesh = *Mesh::Create({"x"}, {4});
  const std::vector<ArraySpec> arrays = {
      {"w", DType::kUint8, {400'000'000}, NamedSharding{mesh, {{"x"}}}}};
  return *MakeSavePlan(arrays, topology);
}

SaveRates Rates() {
  SaveRates rates;
  rates.d2h_gbps = 10;
  rates.host_gbps = 15;
  rates.write_gbps = 2;
  rates.dispatch_s = 0;
  rates.per_slice_s = 0;
  rates.commit_s = 0.01;
  return rates;
}

TEST(PredictTest, CopiesBoundBlockingAndWritesBoundTheSave) {
  const Topology topology = Topology::Uniform(2, 2);
  absl::StatusOr<SavePrediction> p =
      PredictSave(FourShards(topology), topology, int64_t{1} << 30, Rates());
  ASSERT_TRUE(p.ok()) << p.status();
  // A device copies 100 MB at 10 GB/s; a process 200 MB at 15 GB/s.
  EXPECT_THAT(p->copy_s, DoubleNear(0.2 / 15, 1e-9));
  EXPECT_THAT(p->blocked_s, DoubleNear(0.2 / 15, 1e-9));
  EXPECT_EQ(p->blocked_bound, "copy");
  EXPECT_THAT(p->write_s, DoubleNear(0.1, 1e-9));
  // One wave: every copy lands before the first write.
  EXPECT_THAT(p->save_s, DoubleNear(0.2 / 15 + 0.1 + 0.01, 1e-9));
  EXPECT_EQ(p->save_bound, "write");
  EXPECT_EQ(p->process_bytes, 200'000'000);
  EXPECT_EQ(p->device_bytes, 100'000'000);
  EXPECT_EQ(p->waves, 1);
}

TEST(PredictTest, WithoutAHostLimitDevicesCopyInParallel) {
  const Topology topology = Topology::Uniform(2, 2);
  SaveRates rates = Rates();
  rates.host_gbps = 0;
  absl::StatusOr<SavePrediction> p =
      PredictSave(FourShards(topology), topology, int64_t{1} << 30, rates);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->copy_s, DoubleNear(0.1 / 10, 1e-9));
}

TEST(PredictTest, ASmallPoolMakesStagingWaitForWrites) {
  const Topology topology = Topology::Uniform(2, 2);
  absl::StatusOr<SavePrediction> p =
      PredictSave(FourShards(topology), topology, 50'000'000, Rates());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->waves, 5);  // 200 MB plus each slice's 4 KiB rounding
  EXPECT_EQ(p->blocked_bound, "pool");
  // The 150 MB beyond the pool waits for writes at 2 GB/s.
  EXPECT_NEAR(p->blocked_s, 0.2 / 15 + 0.075, 1e-4);
  // Only the first of 5 waves' copies comes before the writes.
  EXPECT_NEAR(p->save_s, 0.2 / 15 / 5 + 0.1 + 0.01, 1e-9);
}

// With an overflow, only what exceeds the budget waits for writes.
TEST(PredictTest, OnlyWhatExceedsTheHostMemoryBudgetWaitsForWrites) {
  const Topology topology = Topology::Uniform(2, 2);
  absl::StatusOr<SavePrediction> held = PredictSave(
      FourShards(topology), topology, 50'000'000, Rates(), 300'000'000);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->blocked_bound, "copy");
  EXPECT_NEAR(held->blocked_s, 0.2 / 15, 1e-4);
  absl::StatusOr<SavePrediction> over = PredictSave(
      FourShards(topology), topology, 50'000'000, Rates(), 100'000'000);
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_EQ(over->blocked_bound, "budget");
  // The 100 MB beyond the budget waits for writes at 2 GB/s.
  EXPECT_NEAR(over->blocked_s, 0.2 / 15 + 0.05, 1e-4);
}

TEST(PredictTest, ASharedFilesystemBoundsTheJob) {
  const Topology topology = Topology::Uniform(2, 2);
  SaveRates rates = Rates();
  rates.fs_gbps = 1;  // 400 MB for the whole job
  absl::StatusOr<SavePrediction> p =
      PredictSave(FourShards(topology), topology, int64_t{1} << 30, rates);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->save_s, DoubleNear(0.4 + 0.01, 1e-9));
  EXPECT_EQ(p->save_bound, "filesystem");
}

TEST(PredictTest, TheBusiestProcessIsTheOneReported) {
  const Topology topology = Topology::Uniform(2, 2);
  ExplicitSharding on_process_1;
  on_process_1.shards = {{2, Box({0}, {300'000'000})}};
  const std::vector<ArraySpec> arrays = {
      {"big", DType::kUint8, {300'000'000}, on_process_1},
      {"small",
       DType::kUint8,
       {4'000'000},
       NamedSharding{*Mesh::Create({"x"}, {4}), {{"x"}}}}};
  absl::StatusOr<SavePrediction> p = PredictSave(
      *MakeSavePlan(arrays, topology), topology, int64_t{1} << 30, Rates());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slowest_process, 1);
  EXPECT_EQ(p->process_bytes, 302'000'000);
  EXPECT_EQ(p->device_bytes, 301'000'000);
}

TEST(PredictTest, RatesThatAreNotPositiveAreRefused) {
  const Topology topology = Topology::Uniform(2, 2);
  const SavePlan plan = FourShards(topology);
  SaveRates rates = Rates();
  rates.write_gbps = 0;
  absl::StatusOr<SavePrediction> p =
      PredictSave(plan, topology, int64_t{1} << 30, rates);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("write 0"));
  rates = Rates();
  rates.commit_s = -1;
  EXPECT_FALSE(PredictSave(plan, topology, int64_t{1} << 30, rates).ok());
  EXPECT_FALSE(PredictSave(plan, topology, 0, Rates()).ok());
}

TEST(PredictTest, MeasuredRatesServeAPredictionAndLeaveNothingBehind) {
  testing::TempDir temp;
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 2});
  std::unique_ptr<Storage> storage = MakePosixStorage();
  absl::StatusOr<SaveRates> rates =
      MeasureSaveRates(*backend, *storage, temp.path(),
                       {.bytes = int64_t{32} << 20, .writer_streams = 2});
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_TRUE(std::filesystem::is_empty(temp.path()));
  // Rates a prediction takes (it refuses what is not positive).
  const Topology topology = Topology::Uniform(2, 2);
  absl::StatusOr<SavePrediction> p =
      PredictSave(FourShards(topology), topology, int64_t{1} << 30, *rates);
  EXPECT_TRUE(p.ok()) << p.status();
}

TEST(PredictTest, MeasuringInADirectoryThatIsMissingFails) {
  testing::TempDir temp;
  std::unique_ptr<Backend> backend = *MakeHostBackend({.num_devices = 1});
  std::unique_ptr<Storage> storage = MakePosixStorage();
  absl::StatusOr<SaveRates> rates =
      MeasureSaveRates(*backend, *storage, temp.path() + "/missing");
  EXPECT_EQ(rates.status().code(), absl::StatusCode::kNotFound)
      << rates.status();
  EXPECT_FALSE(std::filesystem::exists(temp.path() + "/missing"));
}

}  // namespace
}  // namespace hoist
