#include "hoist/checkpoint_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/thread_priority.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/save/extent_writer.h"
#include "hoist/checkpoint/tier/local_tier.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/layout.h"
#include "hoist/host_backend.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "testing/array_bytes.h"
#include "testing/manager_test.h"
#include "testing/mixed_model.h"
#include "testing/shard_buffers.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using testing::BoxBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ManagerTest;

TEST_F(ManagerTest, SaveReturnsStagedAndCommitsInTheBackground) {
  auto manager = Open();
  absl::StatusOr<SaveHandle> handle =
      manager->Save(10, Arrays(), R"({"lr":1})");
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_TRUE(handle->WaitStaged().ok());
  absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->path, root_ + "/step_00000010");
  EXPECT_GT(info->bytes, 0);
  EXPECT_LE(info->staged, info->committed);
  EXPECT_TRUE(handle->status().ok());
  const SaveProgress& progress = handle->progress();
  EXPECT_EQ(progress.total_bytes, info->bytes);
  EXPECT_EQ(progress.staged_bytes.load(), info->bytes);
  EXPECT_EQ(progress.written_bytes.load(), info->bytes);
  EXPECT_THAT(*manager->List(), ElementsAre(10));
  EXPECT_EQ(*manager->Latest(), 10);
  EXPECT_TRUE(manager->Verify(10)->ok());
  ExpectHolds(*manager, std::nullopt, 0);
}

TEST_F(ManagerTest, TrainingLoopWithASmallPoolKeepsTheLastTwo) {
  CheckpointManagerOptions options;
  options.keep_last = 2;
  options.pool_bytes = 16 * 1024;  // smaller than one save: waves
  auto manager = Open(options);
  for (int step = 1; step <= 6; ++step) {
    testing::Refill(model_, shards_, step);
    absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
    ASSERT_TRUE(handle.ok()) << handle.status();
  }
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(5, 6));
  EXPECT_TRUE(manager->Verify(5)->ok());
  EXPECT_TRUE(manager->Verify(6)->ok());
  ExpectHolds(*manager, 5, 5);
  ExpectHolds(*manager, std::nullopt, 6);
}

// Above split_manifest_above_extents a step's manifest is split (hoist/3):
// deltas reference an earlier step through it, retention keeps what it
// references, a restore of some arrays reads only their sections, and
// verify reads them all.
TEST_F(ManagerTest, ASplitManifestServesDeltasRestoresAndVerify) {
  CheckpointManagerOptions options;
  options.split_manifest_above_extents = 0;
  options.keep_last = 2;
  auto manager = Open(options);
  for (int step = 1; step <= 3; ++step) {
    if (step == 3) testing::Refill(model_, shards_, 3);
    absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(handle->WaitCommitted().ok());
  }
  EXPECT_THAT(*manager->List(), ElementsAre(2, 3));
  std::ifstream in(root_ + "/step_00000002/MANIFEST.json");
  std::string start(21, '\0');
  in.read(start.data(), 21);
  EXPECT_EQ(start, "{\"format\": \"hoist/3\",");

  absl::StatusOr<ManifestHead> head =
      ReadManifestHeadAt(root_ + "/step_00000002");
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE(head->split);
  ASSERT_EQ(head->sections.size(), model_.size());
  for (const ManifestSection& section : head->sections) {
    EXPECT_EQ(section.referenced_bytes, section.bytes);  // all in step 1
    EXPECT_GT(section.extents, 0);
  }
  ExpectHolds(*manager, 2, 0);
  ExpectHolds(*manager, 3, 3);
  EXPECT_TRUE(manager->Verify(2)->ok());
  EXPECT_TRUE(manager->Verify(3)->ok());

  // One array of four, onto one device's host memory.
  const ArraySpec& b = model_[1];
  std::vector<uint8_t> bytes(b.shape[0] * 4);
  RestoreTarget target{
      .name = b.name, .dtype = b.dtype, .shape = b.shape, .destinations = {}};
  target.destinations.push_back({.box = Box({0}, b.shape),
                                 .device = nullptr,
                                 .data = bytes.data(),
                                 .tag = 0});
  ASSERT_TRUE(manager->Restore(2, {&target, 1}).ok());
  EXPECT_EQ(bytes, BoxBytes(b, 1, Box({0}, b.shape), 0));
}

// One process with a local tier: steps divisible by persist_every go to
// the durable root, the others to the local root (every local.every-th),
// the rest are skipped; a restore takes the newest step of either tier.
TEST_F(ManagerTest, LocalTierTakesTheStepsBetweenDurableOnes) {
  CheckpointManagerOptions options;
  options.persist_every = 4;
  options.local.root = temp_.path() + "/local/{rank}";
  options.local.every = 2;
  options.local.keep_last = 2;
  auto manager = Open(options);
  ASSERT_NE(manager, nullptr);
  std::vector<Tier> tiers;
  for (int step = 1; step <= 10; ++step) {
    testing::Refill(model_, shards_, step);
    absl::StatusOr<SaveHandle> handle = manager->Save(step, Arrays());
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    ASSERT_TRUE(info.ok()) << info.status();
    const bool saved = step % 2 == 0;  // 4 and 8 durable, 2, 6, 10 local
    EXPECT_EQ(info->skipped, !saved) << step;
    if (saved) tiers.push_back(info->tier);
    EXPECT_EQ(info->replicated_bytes, 0);  // one process: no peer
  }
  EXPECT_THAT(tiers, ElementsAre(Tier::kLocal, Tier::kDurable, Tier::kLocal,
                                 Tier::kDurable, Tier::kLocal));
  EXPECT_THAT(*manager->List(), ElementsAre(4, 8));
  const std::string local = temp_.path() + "/local/0";
  EXPECT_TRUE(std::filesystem::exists(local + "/step_00000010/MANIFEST.json"));
  EXPECT_TRUE(std::filesystem::exists(local + "/step_00000006"));
  EXPECT_FALSE(std::filesystem::exists(local + "/step_00000002"));  // pruned
  // PrepareRestore names what a restore takes, before reading any array:
  // the newest step, local, with its part's manifest; or the one asked for.
  absl::StatusOr<CheckpointManager::PreparedRestore> prepared =
      manager->PrepareRestore(std::nullopt);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->step, 10);
  EXPECT_EQ(prepared->tier, Tier::kLocal);
  EXPECT_TRUE(prepared->manifest.part.has_value());
  EXPECT_EQ(prepared->manifest.arrays.size(), model_.size());
  prepared = manager->PrepareRestore(8);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(prepared->tier, Tier::kDurable);
  EXPECT_FALSE(prepared->manifest.part.has_value());
  EXPECT_EQ(manager->PrepareRestore(7).status().code(),
            absl::StatusCode::kNotFound);
  // The newest step is local; the same sharding restores from it.
  std::vector<ShardBuffers> buffers;
  std::vector<RestoreTarget> targets;
  for (const ArraySpec& spec : model_) {
    buffers.push_back(*AllocateShards(spec, backend_->devices()));
    targets.push_back(buffers.back().target);
  }
  absl::StatusOr<RestoreStats> stats = manager->Restore(std::nullopt, targets);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->restored_from, Tier::kLocal);
  EXPECT_EQ(stats->step, 10);
  for (size_t a = 0; a < model_.size(); ++a) {
    for (const RestoreDestination& dest : targets[a].destinations) {
      const std::vector<uint8_t> expected =
          BoxBytes(model_[a], static_cast<int>(a), dest.box, 10);
      ASSERT_EQ(std::memcmp(dest.data, expected.data(), expected.size()), 0)
          << model_[a].name << " " << dest.box.ToString();
    }
  }
  // One process's part holds every byte: another sharding restores from
  // it too (in a job of several, only the one it was saved with).
  ExpectHolds(*manager, std::nullopt, 10);
  // A step the local tier lacks is the durable tier's.
  ExpectHolds(*manager, 8, 8);
  // The local part of a step is a step a reader can check: a manifest
  // marked as process 0's part of 1, whose extents verify.
  absl::StatusOr<Manifest> part = ReadManifestAt(local + "/step_00000010");
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_TRUE(part->part.has_value());
  EXPECT_EQ(part->part->processes, 1);
}

// A process with nothing to stage (no arrays here; in a job, a rank whose
// devices hold only boxes other ranks save) still commits its step: it
// used to abort the process (an OK status made into a StatusOr).
TEST_F(ManagerTest, ASaveWithNothingToStageCommits) {
  auto manager = Open();
  absl::StatusOr<SaveHandle> handle =
      manager->Save(1, std::vector<SaveArray>{}, R"({"empty": 1})");
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle->WaitCommitted().ok());
  EXPECT_TRUE(manager->ReadManifest(1)->arrays.empty());
}

// Per-rank state reaches the metadata as "per_rank": [rank 0's, ...],
// beside the caller's metadata or alone; what is not JSON, or too large,
// is refused before the step is accepted.
TEST_F(ManagerTest, PerRankStateIsGatheredIntoTheMetadata) {
  auto manager = Open();
  SaveOptions options;
  options.per_rank_json = R"({"rng": [1, 2, 3]})";
  for (const auto& [step, metadata] :
       std::vector<std::pair<int64_t, std::string>>{{1, "{}"},
                                                    {2, R"({"lr": 0.5})"}}) {
    absl::StatusOr<SaveHandle> handle =
        manager->Save(step, Arrays(), metadata, ReturnWhen::kStaged, options);
    ASSERT_TRUE(handle.ok()) << handle.status();
    ASSERT_TRUE(handle->WaitCommitted().ok());
    const nlohmann::json saved =
        nlohmann::json::parse(manager->ReadManifest(step)->metadata_json);
    EXPECT_EQ(saved["per_rank"],
              nlohmann::json::parse(R"([{"rng": [1, 2, 3]}])"))
        << saved;
    if (step == 2) {
      EXPECT_EQ(saved["lr"], 0.5);
    }
  }
  options.per_rank_json = "{not json";
  EXPECT_EQ(manager->Save(3, Arrays(), "{}", ReturnWhen::kStaged, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.per_rank_json = std::string(kMaxPerRankJsonBytes + 1, '1');
  EXPECT_THAT(manager->Save(3, Arrays(), "{}", ReturnWhen::kStaged, options)
                  .status()
                  .message(),
              HasSubstr("small state"));
}

// Writer streams 0 (the default) leaves their number to the root's
// storage: two data files per process on a local filesystem.
TEST_F(ManagerTest, DefaultWriterStreamsAreTheStorages) {
  EXPECT_EQ(CheckpointManagerOptions{}.plan.writer_streams, 0);
  auto manager = Open();
  ASSERT_NE(manager, nullptr);
  absl::StatusOr<SaveHandle> handle = manager->Save(1, Arrays());
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle->WaitCommitted().ok());
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           root_ + "/" + StepDirName(1) + "/data")) {
    files += entry.is_regular_file() ? 1 : 0;
  }
  EXPECT_EQ(files, 2u);
  EXPECT_EQ(MakePosixStorage()->preferred_writer_streams(), 2);
}

// A plan option out of range fails at Open, naming it, not at the first
// save; nothing is made.
TEST_F(ManagerTest, PlanOptionsAreCheckedAtOpen) {
  for (int streams : {-1, 101}) {
    CheckpointManagerOptions options;
    options.plan.writer_streams = streams;
    absl::Status opened =
        CheckpointManager::Open(root_, *backend_, *coordinator_, options)
            .status();
    EXPECT_EQ(opened.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(opened.message(),
                HasSubstr(absl::StrFormat("writer_streams is %d", streams)));
  }
  CheckpointManagerOptions options;
  options.plan.alignment_bytes = 1000;
  EXPECT_THAT(CheckpointManager::Open(root_, *backend_, *coordinator_, options)
                  .status()
                  .message(),
              HasSubstr("alignment_bytes is 1000"));
  EXPECT_FALSE(std::filesystem::exists(root_));
}

TEST_F(ManagerTest, LocalTierOptionsAreChecked) {
  CheckpointManagerOptions options;
  options.persist_every = 0;
  EXPECT_EQ(CheckpointManager::Open(root_, *backend_, *coordinator_, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  options.persist_every = 2;
  options.local.root = temp_.path() + "/local";
  options.local.replicas = 0;
  EXPECT_EQ(CheckpointManager::Open(root_, *backend_, *coordinator_, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Rank 0 of two whose rank 1 answers every all-gather as rank 0 does, but
// has its own local root; it cannot move bulk data (Exchange's default),
// as the Python coordinators.
class TwoRanksWithoutExchange final : public Coordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status Barrier(std::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view name, std::string bytes) override {
    // Where each rank keeps its local root: rank 1's is its own.
    if (name == "local tier hosts") return {{bytes, bytes + "-rank1"}};
    return std::vector<std::string>{bytes, bytes};
  }
  absl::StatusOr<std::string> Broadcast(std::string_view, std::string bytes,
                                        int) override {
    return bytes;
  }
};

TEST(LocalTierTest, ReplicasWithoutExchangeAreRefusedAtOpen) {
  testing::TempDir temp;
  TwoRanksWithoutExchange two;
  std::unique_ptr<Storage> storage = MakePosixStorage();
  absl::StatusOr<std::unique_ptr<LocalTier>> tier =
      LocalTier::Open(temp.path() + "/{rank}", 2, 2, two, *storage);
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(tier.status().message(), HasSubstr("use replicas 1"));
  // One copy needs no exchange.
  tier = LocalTier::Open(temp.path() + "/{rank}", 1, 2, two, *storage);
  ASSERT_TRUE(tier.ok()) << tier.status();
  EXPECT_TRUE((*tier)->replica_holders().empty());
}

TEST(ReplicaOffsetsTest, OtherHostsFirstThenOtherProcesses) {
  // Two hosts of two ranks: +2 lands every rank on the other host.
  EXPECT_THAT(ReplicaOffsets({"a", "a", "b", "b"}, 2), ElementsAre(2));
  EXPECT_THAT(ReplicaOffsets({"a", "a", "b", "b"}, 3), ElementsAre(2, 1));
  // Hosts in turn: +1 and +3 both cross.
  EXPECT_THAT(ReplicaOffsets({"a", "b", "a", "b"}, 3), ElementsAre(1, 3));
  // One host: the next processes.
  EXPECT_THAT(ReplicaOffsets({"a", "a", "a"}, 2), ElementsAre(1));
  // Never more than the other processes, and none for one copy.
  EXPECT_THAT(ReplicaOffsets({"a", "b"}, 5), ElementsAre(1));
  EXPECT_TRUE(ReplicaOffsets({"a", "b"}, 1).empty());
  EXPECT_TRUE(ReplicaOffsets({"a"}, 2).empty());
}

TEST_F(ManagerTest, WhenBusySkipGoesOnWhileStorageIsStuckAndLosesNothing) {
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {});
  CheckpointManagerOptions options;
  options.pool_bytes = 1 << 20;  // the whole model stages at once
  options.when_busy = CheckpointManagerOptions::WhenBusy::kSkip;
  std::unique_ptr<CheckpointManager> manager = Open(options, &storage);
  ASSERT_NE(manager, nullptr);
  storage.Stall();
  // Staged, then stuck writing: the one save in flight.
  absl::StatusOr<SaveHandle> first = manager->Save(1, Arrays());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->skipped());
  while (storage.stalled_calls() == 0) absl::SleepFor(absl::Milliseconds(1));
  // No room: the next save returns at once, skipped, without waiting.
  absl::StatusOr<SaveHandle> second = manager->Save(2, Arrays());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->skipped());
  EXPECT_TRUE(second->WaitStaged().ok());
  absl::StatusOr<SaveInfo> skipped = second->WaitCommitted();
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(skipped->bytes, 0);
  Durability lag = manager->durability();
  EXPECT_EQ(lag.skipped_saves, 1);
  EXPECT_EQ(lag.in_flight, 1);
  EXPECT_FALSE(lag.last_committed_step.has_value());
  EXPECT_EQ(first->status().code(), absl::StatusCode::kUnavailable);
  // The storage comes back: the first save commits, the next is accepted.
  storage.Resume();
  ASSERT_TRUE(first->WaitCommitted().ok());
  absl::StatusOr<SaveHandle> third = manager->Save(3, Arrays());
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->skipped());
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(1, 3));
  lag = manager->durability();
  EXPECT_EQ(lag.last_committed_step, 3);
  EXPECT_EQ(lag.skipped_saves, 1);
  EXPECT_EQ(lag.in_flight, 0);
  ExpectHolds(*manager, 3, 0);
}

// Two ranks that answer nothing: Open must refuse before asking them.
class TwoSilentRanks final : public Coordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status Barrier(std::string_view) override {
    return absl::InternalError("asked");
  }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view,
                                                     std::string) override {
    return absl::InternalError("asked");
  }
  absl::StatusOr<std::string> Broadcast(std::string_view, std::string,
                                        int) override {
    return absl::InternalError("asked");
  }
};

TEST_F(ManagerTest, WhenBusySkipIsRefusedInAJobOfSeveralProcesses) {
  TwoSilentRanks two;
  CheckpointManagerOptions options;
  options.when_busy = CheckpointManagerOptions::WhenBusy::kSkip;
  absl::Status status =
      CheckpointManager::Open(root_, *backend_, two, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("every rank to skip"));
}

TEST_F(ManagerTest, KeepEveryKeepsMultiplesBeyondTheLastN) {
  CheckpointManagerOptions options;
  options.keep_last = 1;
  options.keep_every = 2;
  auto manager = Open(options);
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(manager->Save(step, Arrays()).ok());
  }
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(2, 4, 5));
}

TEST_F(ManagerTest, BackgroundErrorSurfacesOnTheHandleAndTheNextCall) {
  std::unique_ptr<Storage> posix = MakePosixStorage();
  ASSERT_TRUE(posix->CreateDir(root_).ok());  // Open then syncs nothing
  // Sync 0 is the first data file: staging succeeds, persisting fails.
  FaultInjectingStorage faulty(*posix, {.fail_sync = 0, .error = EIO});
  auto manager = Open({}, &faulty);
  absl::StatusOr<SaveHandle> handle = manager->Save(1, Arrays());
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->WaitCommitted().status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(handle->status().code(), absl::StatusCode::kAborted);
  absl::Status next = manager->Save(2, Arrays()).status();
  EXPECT_EQ(next.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(next.message(), HasSubstr("injected sync failure"));
  EXPECT_TRUE(manager->List()->empty());
  // Reported once: the next save goes ahead.
  absl::StatusOr<SaveHandle> retry = manager->Save(2, Arrays());
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->WaitCommitted().ok());
}

TEST_F(ManagerTest, MetadataAManifestCannotCarryIsRefusedBeforeTheStep) {
  auto manager = Open();
  for (const std::string& bad :
       {std::string("[1]"), std::string("{\"lr\": NaN}"),
        std::string("{\"k\": \"caf\xe9\"}")}) {
    absl::Status status = manager->Save(1, Arrays(), bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(manager->Save(-1, Arrays()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_TRUE(manager->List()->empty());
  ASSERT_TRUE(manager->Save(1, Arrays(), R"({"lr": 0.5})").ok());
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(1));
}

TEST_F(ManagerTest, ExistingStepDeleteAndEmptyRoot) {
  auto manager = Open();
  EXPECT_EQ(*manager->Latest(), std::nullopt);
  EXPECT_EQ(manager->Restore(std::nullopt, {}).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(manager->Save(3, Arrays()).ok());
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_EQ(manager->Save(3, Arrays()).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(manager->Delete(3).ok());
  EXPECT_TRUE(manager->List()->empty());
  EXPECT_EQ(manager->Delete(3).code(), absl::StatusCode::kNotFound);
}

TEST_F(ManagerTest, TraceHasATrackPerDevicePerWriterAndTheCommit) {
  Tracer tracer;
  CheckpointManagerOptions options;
  options.tracer = &tracer;
  {
    auto manager = Open(options);
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }
  const std::vector<std::string> tracks = tracer.tracks();
  for (const char* track :
       {"device 0", "device 7", "writer data/r00000_w00.bin",
        "writer data/r00000_w01.bin", "commit"}) {
    EXPECT_THAT(tracks, ::testing::Contains(track));
  }
  const nlohmann::json trace = nlohmann::json::parse(tracer.ToJson());
  int spans = 0, names = 0;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    if (event["ph"] == "X") {
      ++spans;
      EXPECT_GE(event["dur"].get<int64_t>(), 0);
    }
    if (event["ph"] == "M") ++names;
  }
  EXPECT_EQ(names, static_cast<int>(tracks.size()));
  EXPECT_GE(spans, 8 + 2 + 4);  // a copy per device, writes, commit phases
}

TEST_F(ManagerTest, ChangedArraysArePlannedAgain) {
  auto manager = Open();
  std::vector<SaveArray> arrays = Arrays();
  ASSERT_TRUE(manager->Save(1, arrays).ok());
  arrays.pop_back();  // the next save has one array fewer
  ASSERT_TRUE(manager->Save(2, arrays).ok());
  ASSERT_TRUE(manager->Save(3, Arrays()).ok());
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_EQ(manager->Verify(1)->arrays, 4);
  EXPECT_EQ(manager->Verify(2)->arrays, 3);
  EXPECT_EQ(manager->Verify(3)->arrays, 4);
  EXPECT_TRUE(manager->Verify(2)->ok());
  ExpectHolds(*manager, 3, 0);
}

// Registered arrays are saved as they are at each save: the copies
// prepared at a registration's first save read the arrays again at every
// later one, in one wave and in several, in either mode, with a save
// queued behind another (staged by the saver), and to the local tier
// (whose part is planned at its first save) as to the durable root.
TEST_F(ManagerTest, RegisteredArraysAreSavedAsTheyAreAtEachSave) {
  struct Case {
    int64_t pool;
    int max_in_flight;
    bool local;
  };
  for (const Case c :
       {Case{int64_t{1} << 20, 1, false}, Case{int64_t{16} << 10, 1, false},
        Case{int64_t{1} << 20, 2, false}, Case{int64_t{16} << 10, 2, false},
        Case{int64_t{1} << 20, 1, true}}) {
    SCOPED_TRACE(absl::StrFormat("pool %d, in flight %d, local %d", c.pool,
                                 c.max_in_flight, c.local));
    CheckpointManagerOptions options = SmallPool();
    options.pool_bytes = c.pool;
    options.max_in_flight = c.max_in_flight;
    if (c.local) {
      options.persist_every = 2;  // 2 and 4 durable, 1 and 3 local
      options.local.root = temp_.path() + "/local/{rank}";
    }
    auto manager = Open(options);
    ASSERT_NE(manager, nullptr);
    absl::StatusOr<RegisteredArrays> registered = manager->Register(Arrays());
    ASSERT_TRUE(registered.ok()) << registered.status();
    std::vector<SaveHandle> handles;
    for (int64_t step = 1; step <= 4; ++step) {
      testing::Refill(model_, shards_, static_cast<uint64_t>(step));
      const ReturnWhen when =
          step % 2 == 1 ? ReturnWhen::kDispatched : ReturnWhen::kStaged;
      absl::StatusOr<SaveHandle> handle =
          manager->Save(step, *registered, "{}", when);
      ASSERT_TRUE(handle.ok()) << handle.status();
      ASSERT_TRUE(handle->WaitStaged().ok());  // before the next Refill
      handles.push_back(*std::move(handle));
    }
    for (SaveHandle& handle : handles) {
      absl::StatusOr<SaveInfo> info = handle.WaitCommitted();
      ASSERT_TRUE(info.ok()) << info.status();
      if (c.pool == int64_t{1} << 20) {
        EXPECT_EQ(info->dispatches, 8) << "one per device";
      }
      EXPECT_EQ(info->tier, c.local && handle.step() % 2 == 1 ? Tier::kLocal
                                                              : Tier::kDurable);
    }
    for (int64_t step = 1; step <= 4; ++step) {
      ExpectHolds(*manager, step, static_cast<uint64_t>(step));
    }
    const std::vector<int64_t> durable =
        c.local ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{1, 2, 3, 4};
    EXPECT_EQ(*manager->List(), durable);
    manager.reset();
    std::filesystem::remove_all(root_);
    std::filesystem::remove_all(temp_.path() + "/local");
  }
}

// A registration is checked when it is made, and saved only by the
// manager that made it; a refused save commits nothing.
TEST_F(ManagerTest, ARegistrationIsCheckedWhenMadeAndSavedOnlyByItsManager) {
  auto manager = Open();
  ASSERT_NE(manager, nullptr);
  std::vector<SaveArray> foreign = Arrays();
  foreign[0].shards[0].device = 99;
  absl::StatusOr<RegisteredArrays> refused = manager->Register(foreign);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("params/w"));
  EXPECT_THAT(manager->Save(1, RegisteredArrays()).status().message(),
              HasSubstr("empty registration"));

  CheckpointManagerOptions tiny = SmallPool();
  tiny.pool_bytes = 4096;
  tiny.plan.min_slice_bytes = int64_t{1} << 20;  // saved whole: 16 KiB
  const std::string other_root = temp_.path() + "/other";
  absl::StatusOr<std::unique_ptr<CheckpointManager>> other =
      CheckpointManager::Open(other_root, *backend_, *coordinator_, tiny);
  ASSERT_TRUE(other.ok()) << other.status();
  const std::vector<ArraySpec> big = BigReplicatedArray();
  testing::DeviceShards shards = testing::FillShards(big, backend_->devices());
  EXPECT_EQ(
      (*other)->Register(testing::SaveArraysOf(big, shards)).status().code(),
      absl::StatusCode::kResourceExhausted);

  absl::StatusOr<RegisteredArrays> theirs = (*other)->Register({});
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  absl::StatusOr<SaveHandle> handle = manager->Save(1, *theirs);
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(handle.status().message(), HasSubstr("another checkpoint"));
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_TRUE(manager->List()->empty());
}

TEST_F(ManagerTest, ShardOnAForeignDeviceIsInvalid) {
  auto manager = Open();
  std::vector<SaveArray> arrays = Arrays();
  arrays[0].shards[0].device = 99;
  EXPECT_EQ(manager->Save(1, arrays).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// PyTorch's empty tensors (an empty buffer in a state dict) have no data
// pointer: an array with no elements saves and restores without one, given
// or registered; an array with elements still needs its data.
TEST_F(ManagerTest, AnArrayWithNoElementsNeedsNoDataAndOthersStillDo) {
  auto manager = Open();
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  SaveArray empty{{"buffers/mask",
                   DType::kFloat32,
                   {0, 16},
                   NamedSharding{mesh, {{}, {"model"}}}},
                  {}};
  for (DeviceId device = 0; device < 8; ++device) {
    empty.shards.push_back({device, nullptr});
  }
  std::vector<SaveArray> arrays = Arrays();
  arrays.push_back(empty);
  absl::StatusOr<SaveHandle> saved = manager->Save(1, arrays);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(saved->WaitCommitted().ok());
  absl::StatusOr<RegisteredArrays> registered = manager->Register(arrays);
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_TRUE((*manager->Save(2, *registered)).WaitCommitted().ok());
  std::vector<ArraySpec> specs = model_;
  specs.push_back(empty.spec);
  for (int64_t step : {1, 2}) {
    HostArrays host = WholeArraysInHost(specs);
    absl::StatusOr<RestoreStats> stats = manager->Restore(step, host.targets);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(host.bytes.back().size() == 0);
    for (size_t a = 0; a < model_.size(); ++a) {
      const std::vector<uint8_t> expected = BoxBytes(
          model_[a], static_cast<int>(a), Box::FromShape(model_[a].shape));
      EXPECT_EQ(host.bytes[a].span(), absl::MakeConstSpan(expected))
          << "step " << step << " " << model_[a].name;
    }
  }
  std::vector<SaveArray> missing = Arrays();
  missing[1].shards[0].data = nullptr;
  absl::Status refused = manager->Save(3, missing).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("array 'params/b'"));
  EXPECT_THAT(refused.message(), HasSubstr("has no data"));
}

// A pool whose allocation must fail (far more than this machine has): a
// restore into host memory never needs it, the next save reports it.
TEST_F(ManagerTest, RestoreIntoHostMemoryNeedsNoPoolAndASaveReportsItsError) {
  {
    std::unique_ptr<CheckpointManager> manager = Open();
    ASSERT_TRUE((*manager->Save(1, Arrays())).WaitCommitted().ok());
  }
  CheckpointManagerOptions huge;
  huge.pool_bytes = int64_t{1} << 50;  // 1 PiB
  std::unique_ptr<CheckpointManager> manager = Open(huge);
  ASSERT_NE(manager, nullptr);
  HostArrays host = WholeArraysInHost(model_);
  absl::StatusOr<RestoreStats> stats = manager->Restore(1, host.targets);
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (size_t a = 0; a < model_.size(); ++a) {
    const std::vector<uint8_t> expected = BoxBytes(
        model_[a], static_cast<int>(a), Box::FromShape(model_[a].shape));
    EXPECT_EQ(host.bytes[a].span(), absl::MakeConstSpan(expected));
  }
  absl::StatusOr<SaveHandle> save = manager->Save(2, Arrays());
  const absl::Status saved =
      save.ok() ? save->WaitCommitted().status() : save.status();
  EXPECT_EQ(saved.code(), absl::StatusCode::kResourceExhausted) << saved;
  EXPECT_THAT(*manager->List(), ElementsAre(1));
}

// Counts the pools allocated through it (pinning one is allocating it).
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& backend) : backend_(backend) {}
  std::string_view name() const override { return "counting"; }
  absl::Span<Device* const> devices() const override {
    return backend_.devices();
  }
  absl::StatusOr<MemoryBlock> AllocatePinned(int64_t bytes) override {
    allocations_.fetch_add(1);
    return backend_.AllocatePinned(bytes);
  }
  int allocations() const { return allocations_.load(); }

 private:
  Backend& backend_;
  std::atomic<int> allocations_{0};
};

// A root that holds a step pins its pool in the background once the first
// restore returns; with RestoreOptions::pin_pool_after = false, only once
// the caller says so (PinPool), and never twice. (Destroying the manager
// joins the pinner, so each count below is final.)
TEST_F(ManagerTest, APoolStillToPinIsPinnedAfterTheRestoreOrWhenTheCallerSays) {
  {
    std::unique_ptr<CheckpointManager> manager = Open();
    ASSERT_TRUE((*manager->Save(1, Arrays())).WaitCommitted().ok());
  }
  CheckpointManagerOptions options;
  options.pool_bytes = 64 * 1024;
  const auto restore_then_count = [&](bool pin_after, bool pin_later) {
    CountingBackend counting(*backend_);
    auto manager =
        CheckpointManager::Open(root_, counting, *coordinator_, options);
    EXPECT_TRUE(manager.ok()) << manager.status();
    if (!manager.ok()) return -1;
    HostArrays host = WholeArraysInHost(model_);
    RestoreOptions restore = options.restore;
    restore.pin_pool_after = pin_after;
    EXPECT_TRUE((*manager)->Restore(1, host.targets, nullptr, restore).ok());
    if (pin_later) {
      (*manager)->PinPool();
      (*manager)->PinPool();  // once only
    }
    manager->reset();
    return counting.allocations();
  };
  EXPECT_EQ(restore_then_count(/*pin_after=*/true, /*pin_later=*/false), 1);
  EXPECT_EQ(restore_then_count(false, false), 0);
  EXPECT_EQ(restore_then_count(false, true), 1);
}

TEST_F(ManagerTest, PoolPinnedAtOpenReportsItsErrorFromOpen) {
  CheckpointManagerOptions options;
  options.pool_bytes = int64_t{1} << 50;
  options.pool_pinning = CheckpointManagerOptions::PoolPinning::kAtOpen;
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, *backend_, *coordinator_, options);
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(ManagerTest, RestoringSomeArraysReadsOnlyTheirExtents) {
  std::unique_ptr<CheckpointManager> manager = Open();
  ASSERT_TRUE((*manager->Save(1, Arrays())).WaitCommitted().ok());
  const Manifest manifest = *manager->ReadManifest(1);
  // params/b and opt/count only.
  const std::vector<ArraySpec> some = {model_[1], model_[3]};
  HostArrays host = WholeArraysInHost(some);
  absl::StatusOr<RestoreStats> stats = manager->Restore(1, host.targets);
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t their_bytes = 0, their_extents = 0;
  for (const ManifestArray& array : manifest.arrays) {
    if (array.name != "params/b" && array.name != "opt/count") continue;
    for (const ManifestExtent& extent : array.extents) {
      their_bytes += extent.length_bytes;
      ++their_extents;
    }
  }
  EXPECT_EQ(stats->bytes_read, their_bytes);
  EXPECT_EQ(stats->extents_read, their_extents);
  EXPECT_EQ(stats->target_bytes, (48 + 1) * 4);
  const std::vector<uint8_t> b =
      BoxBytes(model_[1], 1, Box::FromShape(model_[1].shape));
  EXPECT_EQ(host.bytes[0].span(), absl::MakeConstSpan(b));
  // A name the step does not hold is an error naming it.
  std::vector<RestoreTarget> unknown = {host.targets[0]};
  unknown[0].name = "params/nope";
  EXPECT_EQ(manager->Restore(1, unknown).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(manager->Restore(1, unknown).status().message(),
              HasSubstr("params/nope"));
}

// The nice value and scheduling policy of this process's thread named
// `name` (from /proc/self/task), or nullopt when there is none.
std::optional<std::pair<int, int>> ThreadNiceAndPolicy(
    const std::string& name) {
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    if (comm != name) continue;
    std::string stat;
    std::getline(std::ifstream(task.path() / "stat"), stat);
    // Fields after the ")" that closes the name: state is field 3, nice 19,
    // policy 41.
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
    return std::make_pair(std::stoi(f[19 - 3]), std::stoi(f[41 - 3]));
  }
  return std::nullopt;
}

TEST_F(ManagerTest, SaverKeepsThePriorityAndWritersRunBelowIt) {
  const int own_nice = getpriority(PRIO_PROCESS, 0);
  // The saver dispatches the device copies, on the training loop's clock:
  // it keeps the process's priority, under SCHED_BATCH (its wake-ups do not
  // preempt the loop's thread).
  std::unique_ptr<CheckpointManager> manager = Open();
  ASSERT_TRUE((*manager->Save(1, Arrays())).WaitCommitted().ok());
  const auto saver = ThreadNiceAndPolicy("hoist-saver");
  ASSERT_TRUE(saver.has_value());
  EXPECT_EQ(saver->first, own_nice);
  EXPECT_EQ(saver->second, SCHED_BATCH);
  // Writer threads run the setup the manager hands them (its lowering) as
  // they start, before they write or hash anything.
  const SavePlan plan = *MakeSavePlan(model_, Topology::Uniform(1, 8), {});
  const std::string dir = temp_.path() + "/writer";
  std::filesystem::create_directories(dir + "/data");
  std::unique_ptr<Storage> storage = MakePosixStorage();
  for (const bool idle : {false, true}) {
    absl::StatusOr<std::unique_ptr<ExtentWriter>> writer =
        ExtentWriter::Open(*storage, dir, plan, 0, 1, nullptr, nullptr, [idle] {
          ASSERT_TRUE(LowerThisThreadPriority(idle ? 0 : 10, idle).ok());
        });
    ASSERT_TRUE(writer.ok()) << writer.status();
    std::optional<std::pair<int, int>> nice_policy;
    for (int tries = 0; tries < 500 && !nice_policy; ++tries) {
      nice_policy = ThreadNiceAndPolicy("hoist-writer");
      if (nice_policy && (idle ? nice_policy->second != SCHED_IDLE
                               : nice_policy->first == own_nice)) {
        nice_policy.reset();  // started, not yet lowered
      }
      if (!nice_policy) absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_TRUE(nice_policy.has_value()) << (idle ? "idle" : "nice");
    if (idle) {
      EXPECT_EQ(nice_policy->second, SCHED_IDLE);
    } else {
      EXPECT_EQ(nice_policy->first, std::min(19, own_nice + 10));
    }
    writer->reset();
    std::filesystem::remove_all(dir + "/data");
    std::filesystem::create_directories(dir + "/data");
  }
}

}  // namespace
}  // namespace hoist
