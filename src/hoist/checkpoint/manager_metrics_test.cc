// What a save and a restore report of where their time went: phases in
// SaveInfo and RestoreStats, the metrics file's records, the stall warning.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "hoist/checkpoint/metrics_log.h"
#include "hoist/checkpoint/stall_watch.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "testing/manager_test.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ManagerTest;

std::vector<std::string> NamesOf(const std::vector<PhaseStat>& phases) {
  std::vector<std::string> names;
  for (const PhaseStat& phase : phases) names.push_back(phase.phase);
  return names;
}

absl::Duration SumOf(const std::vector<PhaseStat>& phases) {
  absl::Duration sum;
  for (const PhaseStat& phase : phases) sum += phase.elapsed;
  return sum;
}

std::vector<nlohmann::json> ReadRecords(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

TEST_F(ManagerTest, ASaveAndARestoreReportTheirPhasesAndAppendThem) {
  CheckpointManagerOptions options;
  options.keep_last = 1;
  options.metrics_path = temp_.path() + "/metrics.{rank}.jsonl";
  auto manager = Open(options);
  SaveInfo last;
  for (int step = 1; step <= 2; ++step) {
    testing::Refill(model_, shards_, step);
    absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    ASSERT_TRUE(info.ok()) << info.status();
    last = *info;
  }
  // WaitCommitted returns once retention is over: it is the last phase.
  EXPECT_THAT(NamesOf(last.phases),
              ElementsAre("planning", "queued", "staging", "write", "hash",
                          "commit", "retention"));
  EXPECT_EQ(SumOf(last.phases), last.elapsed);
  EXPECT_GE(last.elapsed, last.committed);
  for (const PhaseStat& phase : last.phases) EXPECT_EQ(phase.rank, 0);
  EXPECT_EQ(last.phases[2].bytes, last.bytes);  // staged
  EXPECT_EQ(last.phases[3].bytes, last.bytes - last.referenced_bytes);
  EXPECT_GT(last.phases[5].bytes, 0);  // the manifest, by rank 0
  EXPECT_THAT(NamesOf(last.slowest),
              ElementsAre("planning", "queued", "staging", "write"));

  ExpectHolds(*manager, 2, 2);
  const std::vector<nlohmann::json> records =
      ReadRecords(temp_.path() + "/metrics.0.jsonl");
  ASSERT_EQ(records.size(), 2 * 7 + 4u);  // two saves, one restore
  std::vector<std::string> restore_phases;
  double seconds = 0, elapsed = 0;
  for (const nlohmann::json& record : records) {
    EXPECT_EQ(record["rank"], 0);
    EXPECT_EQ(record["tier"], "durable");
    if (record["kind"] == "restore") {
      EXPECT_EQ(record["step"], 2);
      restore_phases.push_back(record["phase"]);
      seconds += record["seconds"].get<double>();
      elapsed = record["elapsed_s"].get<double>();
    } else {
      EXPECT_EQ(record["kind"], "save");
    }
  }
  EXPECT_THAT(restore_phases,
              ElementsAre("planning", "read", "verify", "place"));
  EXPECT_NEAR(seconds, elapsed, 1e-5);
  EXPECT_TRUE(records[3].contains("slowest_rank"));   // write
  EXPECT_FALSE(records[4].contains("slowest_rank"));  // hash
}

TEST_F(ManagerTest, AMetricsPathThatCannotBeWrittenFailsOpen) {
  CheckpointManagerOptions options;
  options.metrics_path = temp_.path() + "/no/such/dir/metrics.jsonl";
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, *backend_, *coordinator_, options);
  ASSERT_FALSE(manager.ok());
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(manager.status().message(),
              HasSubstr("metrics_path " + options.metrics_path));
}

TEST(MetricsLog, RecordsAreJsonLinesWithTheSlowestWhereKnown) {
  const std::vector<PhaseStat> phases = {
      {"staging", absl::Milliseconds(250), 1024, 3},
      {"hash", absl::Milliseconds(5), 64, 3}};
  const std::vector<PhaseStat> slowest = {
      {"staging", absl::Milliseconds(400), 2048, 1}};
  const std::string lines = FormatPhaseRecords(
      {"save", 7, Tier::kDurable, absl::Milliseconds(255), phases, slowest},
      absl::FromUnixSeconds(100));
  std::vector<nlohmann::json> records;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    records.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["phase"], "staging");
  EXPECT_EQ(records[0]["rank"], 3);
  EXPECT_EQ(records[0]["step"], 7);
  EXPECT_EQ(records[0]["bytes"], 1024);
  EXPECT_DOUBLE_EQ(records[0]["seconds"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(records[0]["elapsed_s"].get<double>(), 0.255);
  EXPECT_DOUBLE_EQ(records[0]["time"].get<double>(), 100);
  EXPECT_EQ(records[0]["slowest_rank"], 1);
  EXPECT_DOUBLE_EQ(records[0]["slowest_s"].get<double>(), 0.4);
  EXPECT_FALSE(records[1].contains("slowest_rank"));
}

// A stall is said once; bytes or a phase that move start the clock again;
// so does a new save.
TEST(StallClock, SaysAStallOnceAndStartsAgainWhenTheSaveMoves) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const auto at = [&](int seconds) { return t0 + absl::Seconds(seconds); };
  StallClock clock(absl::Seconds(60));
  EXPECT_FALSE(clock.Stalled(12, 100, "upload", at(0)));
  EXPECT_FALSE(clock.Stalled(12, 100, "upload", at(59)));
  EXPECT_TRUE(clock.Stalled(12, 100, "upload", at(60)));
  EXPECT_EQ(clock.StalledFor(at(60)), absl::Seconds(60));
  EXPECT_FALSE(clock.Stalled(12, 100, "upload", at(61)));  // said once
  EXPECT_FALSE(clock.Stalled(12, 100, "upload", at(600)));
  EXPECT_FALSE(clock.Stalled(12, 200, "upload", at(601)));  // bytes moved
  EXPECT_FALSE(clock.Stalled(12, 200, "upload", at(660)));
  EXPECT_TRUE(clock.Stalled(12, 200, "upload", at(661)));  // a new stall
  EXPECT_FALSE(clock.Stalled(12, 200, "hash", at(662)));   // a new phase
  EXPECT_TRUE(clock.Stalled(12, 200, "hash", at(722)));
  EXPECT_FALSE(clock.Stalled(13, 200, "hash", at(723)));  // a new save
  clock.Reset();
  EXPECT_FALSE(clock.Stalled(13, 200, "hash", at(800)));
  EXPECT_FALSE(clock.Stalled(13, 200, "hash", at(859)));
}

// The watch's thread samples the save and hands the warning, naming its
// phase, rank and file, to the callback.
TEST(StallWatch, WarnsAboutASaveThatStopsMoving) {
  std::vector<std::string> warnings;
  Mutex mu;
  absl::Notification warned;
  StallWatch watch(absl::Milliseconds(200), 3, [&](const std::string& m) {
    MutexLock lock(&mu);
    warnings.push_back(m);
    if (!warned.HasBeenNotified()) warned.Notify();
  });
  auto progress = std::make_shared<SaveProgress>();
  progress->phase.store("upload");
  progress->writing.Set("s3://bucket/ckpt/step_00000012.tmp/data/r3.bin");
  progress->written_bytes.store(100);
  watch.Watch(12, progress);
  ASSERT_TRUE(warned.WaitForNotificationWithTimeout(absl::Seconds(60)));
  watch.Unwatch();
  MutexLock lock(&mu);
  ASSERT_FALSE(warnings.empty());
  EXPECT_THAT(warnings[0], HasSubstr("step 12 on rank 3"));
  EXPECT_THAT(warnings[0], HasSubstr("in phase upload"));
  EXPECT_THAT(warnings[0],
              HasSubstr("s3://bucket/ckpt/step_00000012.tmp/data/r3.bin"));
}

// A restore whose reads stop is warned about like a save: its step, the
// rank and the data file it reads. It goes on once storage does.
TEST_F(ManagerTest, WarnsAboutARestoreThatStopsReading) {
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {});
  Mutex mu;
  std::vector<std::string> warnings;
  absl::Notification warned;
  CheckpointManagerOptions options;
  options.stall_warn = absl::Milliseconds(200);
  options.on_warning = [&](const std::string& message) {
    MutexLock lock(&mu);
    warnings.push_back(message);
    if (!warned.HasBeenNotified()) warned.Notify();
  };
  std::unique_ptr<CheckpointManager> manager = Open(options, &storage);
  ASSERT_NE(manager, nullptr);
  ASSERT_TRUE(manager->Save(1, Arrays())->WaitCommitted().ok());
  storage.StallReads("/data/");
  std::thread restore([&] { ExpectHolds(*manager, 1, 0); });
  const bool said = warned.WaitForNotificationWithTimeout(absl::Seconds(60));
  storage.Resume();
  restore.join();
  ASSERT_TRUE(said);
  MutexLock lock(&mu);
  EXPECT_THAT(warnings[0], HasSubstr("the restore of step 1 on rank 0 has "
                                     "read no bytes for"));
  EXPECT_THAT(warnings[0], HasSubstr("reading "));
  EXPECT_THAT(warnings[0], HasSubstr("step_00000001/data/"));
}

TEST(StallWatch, NamesAStallBeforeAnyWrite) {
  SaveProgress progress;
  progress.phase.store("hash");
  const std::string message =
      StallWatch::Message(4, 1, absl::Seconds(61), progress);
  EXPECT_THAT(message, HasSubstr("for 1m1s, in phase hash"));
  EXPECT_THAT(message, HasSubstr("no file or object written yet"));
}

}  // namespace
}  // namespace hoist
