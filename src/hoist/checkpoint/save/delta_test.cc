// Delta checkpoints end to end (docs/delta.md): what a save writes and
// references, that every kept step restores bit-exact through references,
// and what retention, Delete and recovery keep on disk.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/checkpoint_root.h"
#include "hoist/format/manifest_index.h"
#include "hoist/format/references_file.h"
#include "hoist/host_backend.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "testing/array_bytes.h"
#include "testing/mixed_model.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A frozen base (256 KiB, never changes), an adapter (8 KiB) and a counter
// that change at every step.
constexpr int kFrozen = 0;
std::vector<ArraySpec> LoraModel() {
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  return {
      {"base/w",
       DType::kFloat32,
       {256, 256},
       NamedSharding{mesh, {{}, {"model"}}}},
      {"lora/a", DType::kFloat32, {64, 32}, NamedSharding{mesh, {{"data"}}}},
      {"count", DType::kInt32, {}, Sharding::Replicated(mesh)},
  };
}

// The bytes regular files under `dir` occupy on disk (holes excluded).
int64_t DiskBytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st;
    if (entry.is_regular_file() && ::stat(entry.path().c_str(), &st) == 0) {
      bytes += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

SaveOptions Deltas(bool on) {
  SaveOptions options;
  options.deltas = on;
  return options;
}

class DeltaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *MakeHostBackend({.num_devices = 8});
    model_ = LoraModel();
    shards_ = testing::FillShards(model_, backend_->devices());
    root_ = temp_.path() + "/ckpt";
    for (const ArraySpec& spec : model_) {
      state_bytes_ +=
          Box::FromShape(spec.shape).num_elements() * ItemSize(spec.dtype);
    }
  }

  std::unique_ptr<CheckpointManager> Open(CheckpointManagerOptions options = {},
                                          Storage* storage = nullptr) {
    options.pool_bytes = 1 << 20;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
        CheckpointManager::Open(root_, *backend_, *coordinator_, options,
                                storage);
    EXPECT_TRUE(manager.ok()) << manager.status();
    return manager.ok() ? *std::move(manager) : nullptr;
  }

  // The training step: every array but the frozen one takes `step`'s
  // values.
  void Train(int64_t step) {
    for (int a = 0; a < static_cast<int>(model_.size()); ++a) {
      if (a != kFrozen) testing::RefillArray(model_, shards_, a, step);
    }
  }

  // Train(step), then saves it and waits for the commit.
  SaveInfo SaveStep(CheckpointManager& manager, int64_t step,
                    const SaveOptions& options = {}) {
    Train(step);
    absl::StatusOr<SaveHandle> handle =
        manager.Save(step, testing::SaveArraysOf(model_, shards_), "{}",
                     ReturnWhen::kStaged, options);
    EXPECT_TRUE(handle.ok()) << handle.status();
    if (!handle.ok()) return {};
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? *info : SaveInfo{};
  }

  // Reads `step` whole from the root and checks every byte, and (with
  // `verify`) that hoist verify finds no problem.
  void ExpectStep(CheckpointRoot& root, int64_t step, bool verify = true) {
    HostArrays host = WholeArraysInHost(model_);
    absl::StatusOr<RestoreStats> stats = root.Read(step, host.targets);
    ASSERT_TRUE(stats.ok()) << "step " << step << ": " << stats.status();
    // References cost no extra reads: each extent once.
    EXPECT_EQ(stats->bytes_read, stats->target_bytes) << "step " << step;
    for (size_t a = 0; a < model_.size(); ++a) {
      const std::vector<uint8_t> expected = testing::BoxBytes(
          model_[a], static_cast<int>(a), Box::FromShape(model_[a].shape),
          static_cast<int>(a) == kFrozen ? 0 : step);
      EXPECT_EQ(host.bytes[a].span(), absl::MakeConstSpan(expected))
          << "step " << step << " " << model_[a].name;
    }
    if (!verify) return;
    absl::StatusOr<VerifyReport> report = root.Verify(step);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->ok()) << report->problems.front();
  }

  std::unique_ptr<CheckpointRoot> Root() {
    return *CheckpointRoot::OpenForReading(root_);
  }

  int64_t FrozenBytes() const {
    return Box::FromShape(model_[kFrozen].shape).num_elements() * 4;
  }

  testing::TempDir temp_;
  std::string root_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Coordinator> coordinator_ = MakeSingleProcessCoordinator();
  std::vector<ArraySpec> model_;
  testing::DeviceShards shards_;
  int64_t state_bytes_ = 0;
};

TEST_F(DeltaTest, UnchangedExtentsAreReferencedNotWritten) {
  auto manager = Open();
  const SaveInfo first = SaveStep(*manager, 1);
  EXPECT_EQ(first.referenced_bytes, 0);
  const SaveInfo second = SaveStep(*manager, 2);
  EXPECT_EQ(second.bytes, first.bytes);
  EXPECT_EQ(second.referenced_bytes, FrozenBytes());
  const SaveInfo third = SaveStep(*manager, 3);
  EXPECT_EQ(third.referenced_bytes, FrozenBytes());

  // Step 3's frozen extents point at step 1, which wrote them (one hop),
  // with the same files, offsets and hashes; the others are its own.
  const Manifest one = *manager->ReadManifest(1);
  const Manifest three = *manager->ReadManifest(3);
  for (size_t a = 0; a < three.arrays.size(); ++a) {
    for (size_t e = 0; e < three.arrays[a].extents.size(); ++e) {
      const ManifestExtent& extent = three.arrays[a].extents[e];
      EXPECT_TRUE(extent.hash.wide);
      if (three.arrays[a].name == model_[kFrozen].name) {
        EXPECT_EQ(extent.step, 1);
        ManifestExtent original = one.arrays[a].extents[e];
        original.step = 1;
        EXPECT_EQ(extent, original);
      } else {
        EXPECT_FALSE(extent.step.has_value());
      }
    }
  }
  // Step 3's data files hold the changed bytes only: holes elsewhere.
  EXPECT_LT(DiskBytes(root_ + "/step_00000003"), FrozenBytes() / 4);
  auto root = Root();
  for (int64_t step : {1, 2, 3}) ExpectStep(*root, step);
}

TEST_F(DeltaTest, DeltasCanBeTurnedOffPerManagerAndPerSave) {
  CheckpointManagerOptions off;
  off.deltas = false;
  auto manager = Open(off);
  SaveStep(*manager, 1);
  EXPECT_EQ(SaveStep(*manager, 2).referenced_bytes, 0);
  EXPECT_EQ(SaveStep(*manager, 3, Deltas(true)).referenced_bytes,
            FrozenBytes());
  manager.reset();
  manager = Open();
  EXPECT_EQ(SaveStep(*manager, 4, Deltas(false)).referenced_bytes, 0);
  EXPECT_EQ(SaveStep(*manager, 5).referenced_bytes, FrozenBytes());
  auto root = Root();
  for (int64_t step : {1, 2, 3, 4, 5}) ExpectStep(*root, step);
}

// The issue's figure: a small changing part saved 6 times with keep_last=3
// holds about one state plus the kept changes (3 states without deltas).
TEST_F(DeltaTest, RetentionHoldsOneStatePlusTheChangedParts) {
  CheckpointManagerOptions options;
  options.keep_last = 3;
  auto manager = Open(options);
  for (int64_t step = 1; step <= 6; ++step) SaveStep(*manager, step);
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_THAT(*manager->List(), ElementsAre(4, 5, 6));
  auto root = Root();
  std::vector<RootEntry> entries = *root->Entries();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].step, 1);
  EXPECT_EQ(entries[0].kind, RootEntry::Kind::kReferenced);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step_00000002"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step_00000003"));
  EXPECT_LE(DiskBytes(root_), state_bytes_ * 13 / 10)
      << "state " << state_bytes_;
  for (int64_t step : {4, 5, 6}) ExpectStep(*root, step);
  // A referenced step is no checkpoint.
  EXPECT_EQ(root->ReadManifest(1).status().code(), absl::StatusCode::kNotFound);
}

CheckpointManagerOptions Frozen(int check_every = 0) {
  CheckpointManagerOptions options;
  options.frozen = [](std::string_view name) { return name == "base/w"; };
  options.frozen_check_every = check_every;
  return options;
}

TEST_F(DeltaTest, FrozenArraysAreCopiedOnceThenReferenced) {
  auto manager = Open(Frozen());
  absl::StatusOr<SaveHandle> first = [&] {
    Train(1);
    return manager->Save(1, testing::SaveArraysOf(model_, shards_));
  }();
  ASSERT_TRUE(first.ok() && first->WaitCommitted().ok());
  EXPECT_EQ(first->progress().staged_bytes.load(), state_bytes_);
  for (int64_t step : {2, 3}) {
    Train(step);
    absl::StatusOr<SaveHandle> handle =
        manager->Save(step, testing::SaveArraysOf(model_, shards_));
    ASSERT_TRUE(handle.ok()) << handle.status();
    absl::StatusOr<SaveInfo> info = handle->WaitCommitted();
    ASSERT_TRUE(info.ok()) << info.status();
    // Not even copied off the devices: only the rest was staged.
    EXPECT_EQ(handle->progress().staged_bytes.load(),
              state_bytes_ - FrozenBytes());
    EXPECT_EQ(info->bytes, state_bytes_);
    EXPECT_EQ(info->referenced_bytes, FrozenBytes());
  }
  EXPECT_EQ(manager->ReadManifest(3)->arrays[kFrozen].extents[0].step, 1);
  auto root = Root();
  for (int64_t step : {1, 2, 3}) ExpectStep(*root, step);
}

TEST_F(DeltaTest, AFrozenArrayThatChangesFailsTheSaveThatChecksIt) {
  auto manager = Open(Frozen(/*check_every=*/2));
  SaveStep(*manager, 1);  // copies it: nothing to compare with
  SaveStep(*manager, 2);  // leaves it out
  testing::RefillArray(model_, shards_, kFrozen, 99);  // the caller's error
  Train(3);
  absl::StatusOr<SaveHandle> handle =
      manager->Save(3, testing::SaveArraysOf(model_, shards_));
  ASSERT_TRUE(handle.ok()) << handle.status();
  const absl::Status status = handle->WaitCommitted().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("array 'base/w' is frozen"));
  EXPECT_FALSE(manager->WaitUntilFinished().ok());  // reported once more
  EXPECT_THAT(*manager->List(), ElementsAre(1, 2));
  testing::RefillArray(model_, shards_, kFrozen, 0);
  auto root = Root();
  ExpectStep(*root, 1);
  ExpectStep(*root, 2);
}

TEST_F(DeltaTest, DeleteKeepsReferencedFilesUntilNothingReadsThem) {
  {
    auto manager = Open();
    for (int64_t step = 1; step <= 3; ++step) SaveStep(*manager, step);
  }
  auto root = *CheckpointRoot::Open(root_);
  ASSERT_TRUE(root->Delete(1).ok());
  EXPECT_EQ((*root->Entries())[0].kind, RootEntry::Kind::kReferenced);
  EXPECT_THAT(*root->List(), ElementsAre(2, 3));
  EXPECT_GT(*root->HeldBytes(1), 0);
  ExpectStep(*root, 2);
  ExpectStep(*root, 3);
  ASSERT_TRUE(root->Delete(2).ok());
  ExpectStep(*root, 3);
  EXPECT_TRUE(std::filesystem::exists(root_ + "/step_00000001"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step_00000002"));
  // The last step that read step 1's files goes, and they go with it.
  ASSERT_TRUE(root->Delete(3).ok());
  EXPECT_TRUE(root->Entries()->empty());
  EXPECT_EQ(root->Delete(1).code(), absl::StatusCode::kNotFound);
}

// Counts the opens of any step's MANIFEST.json.
class CountingStorage final : public StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    if (path.ends_with(kManifestFileName)) ++manifests_opened;
    return StorageWrapper::OpenReadable(path);
  }
  std::atomic<int> manifests_opened{0};
};

// Each committed step says what it reads of other steps (REFERENCES.json):
// retention then decodes no kept step's manifest (at 100,000 arrays each
// decode took more than a second: issue 78).
TEST_F(DeltaTest, RetentionReadsWhatEachStepReferencesNotItsManifest) {
  root_ = "/ckpt";
  MemoryStorage memory;
  CountingStorage counting(memory);
  CheckpointManagerOptions options;
  options.keep_last = 2;
  auto manager = Open(options, &counting);
  for (int64_t step = 1; step <= 3; ++step) SaveStep(*manager, step);
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  const int before = counting.manifests_opened.load();
  SaveStep(*manager, 4);  // deletes step 2; step 1 is referenced
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_EQ(counting.manifests_opened.load(), before);
  EXPECT_THAT(*manager->List(), ElementsAre(3, 4));
  const std::vector<std::string> files =
      *ReadReferencesFile(memory, root_ + "/step_00000004", 4);
  EXPECT_EQ(files, FilesReferenced(*manager->ReadManifest(4)));
  ASSERT_FALSE(files.empty());
  EXPECT_TRUE(files[0].starts_with("step_00000001/")) << files[0];
  EXPECT_TRUE(ReadReferencesFile(memory, root_ + "/step_00000001", 1)->empty());
  manager.reset();
  auto root = *CheckpointRoot::Open(root_, &memory);
  for (int64_t step : {3, 4}) ExpectStep(*root, step);
}

// A step without the file (an older hoist wrote it) and one whose file
// does not check are read through their manifests: nothing they reference
// is deleted. hoist verify names a file that does not check.
TEST_F(DeltaTest, AStepWhoseReferencesDoNotCheckIsReadThroughItsManifest) {
  {
    auto manager = Open();
    for (int64_t step = 1; step <= 3; ++step) SaveStep(*manager, step);
  }
  std::filesystem::remove(root_ + "/step_00000002/REFERENCES.json");
  // Lists nothing, under a hash that does not match.
  std::ofstream(root_ + "/step_00000003/REFERENCES.json", std::ios::trunc)
      << R"({"format": "hoist-references/1", "step": 3, "files": [], )"
      << R"("xxh3": "0000000000000001"})";
  auto root = *CheckpointRoot::Open(root_);
  ASSERT_TRUE(root->Delete(1).ok());
  EXPECT_EQ((*root->Entries())[0].kind, RootEntry::Kind::kReferenced);
  ExpectStep(*root, 2);
  ExpectStep(*root, 3, /*verify=*/false);
  ASSERT_TRUE(root->Delete(2).ok());
  ExpectStep(*root, 3, /*verify=*/false);
  EXPECT_TRUE(std::filesystem::exists(root_ + "/step_00000001"));
  absl::StatusOr<VerifyReport> report = root->Verify(3);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_THAT(report->problems[0],
              HasSubstr("REFERENCES.json of step 3: its files do not match "
                        "their xxh3"));
}

TEST_F(DeltaTest, RecoveryKeepsReferencedFilesAndRemovesTheRest) {
  {
    auto manager = Open();
    for (int64_t step = 1; step <= 2; ++step) SaveStep(*manager, step);
    ASSERT_TRUE(manager->Delete(1).ok());
  }
  // What a crash can leave: a file nothing references in the referenced
  // step, and a step directory without a manifest that nothing references.
  std::ofstream(root_ + "/step_00000001/data/stray.bin") << "stray";
  std::filesystem::create_directories(root_ + "/step_00000009/data");
  std::ofstream(root_ + "/step_00000009/data/r00000_w00.bin") << "orphan";
  auto manager = Open();
  EXPECT_FALSE(
      std::filesystem::exists(root_ + "/step_00000001/data/stray.bin"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step_00000009"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/step_00000001"));
  EXPECT_THAT(*manager->List(), ElementsAre(2));
  // A new save references step 1's bytes too (the one hop, still there).
  EXPECT_EQ(SaveStep(*manager, 3).referenced_bytes, FrozenBytes());
  EXPECT_EQ(manager->ReadManifest(3)->arrays[kFrozen].extents[0].step, 1);
  auto root = Root();
  ExpectStep(*root, 2);
  ExpectStep(*root, 3);
}

TEST_F(DeltaTest, ManagerRefusesToDeleteTheBaseOfASaveInFlight) {
  auto manager = Open();
  SaveStep(*manager, 1);
  Train(2);
  absl::StatusOr<SaveHandle> handle =
      manager->Save(2, testing::SaveArraysOf(model_, shards_));
  ASSERT_TRUE(handle.ok());
  const absl::Status deleted = manager->Delete(1);
  ASSERT_TRUE(handle->WaitCommitted().ok());
  // Refused while step 2 was in flight, or done after it committed: either
  // way step 2 restores.
  if (!deleted.ok()) {
    EXPECT_EQ(deleted.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(deleted.message(), HasSubstr("WaitUntilFinished"));
  }
  ExpectStep(*Root(), 2);
}

// A power cut at every sync point of a delta save and of the retention
// that turns its base into a referenced step: after recovery, every
// committed step restores bit-exact, the acknowledged one among them.
TEST_F(DeltaTest, CrashAtEverySyncPointLosesNoCommittedStep) {
  root_ = "/ckpt";
  int crashes = 0;
  for (int sync = 0;; ++sync) {
    MemoryStorage memory;
    {
      auto manager = Open({}, &memory);
      SaveStep(*manager, 1);
    }
    bool acknowledged = false;
    FaultInjectingStorage faulty(memory, {.crash_at_sync = sync});
    {
      CheckpointManagerOptions options;
      options.keep_last = 1;
      options.pool_bytes = 1 << 20;
      absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
          CheckpointManager::Open(root_, *backend_, *coordinator_, options,
                                  &faulty);
      if (manager.ok()) {
        Train(2);
        absl::StatusOr<SaveHandle> handle =
            (*manager)->Save(2, testing::SaveArraysOf(model_, shards_));
        acknowledged = handle.ok() && handle->WaitCommitted().ok();
        (*manager)->WaitUntilFinished().IgnoreError();
      }
    }
    memory.Crash();
    auto root = *CheckpointRoot::Open(root_, &memory);
    const std::vector<int64_t> steps = *root->List();
    ASSERT_FALSE(steps.empty()) << "sync " << sync;
    if (acknowledged) {
      EXPECT_EQ(steps.back(), 2) << "sync " << sync;
    }
    for (int64_t step : steps) ExpectStep(*root, step);
    if (!faulty.crashed()) {
      EXPECT_THAT(steps, ElementsAre(2));
      break;
    }
    ++crashes;
  }
  EXPECT_GE(crashes, 5);
}

// Lookups by name are indexed: a repeated save of many arrays with deltas
// (its base's array per array) and its restore (each target's array) make
// a bounded number of name comparisons per array, counted, not timed. A
// scan per lookup (issue 55) made 50,000,000 of them here; the index,
// about 21,000 (release) and 42,000 (debug, whose tables check themselves).
TEST_F(DeltaTest, LookupsByNameCostAFewComparisonsPerArray) {
  constexpr int kArrays = 10000;
  const Mesh mesh = *Mesh::Create({"data"}, {8});
  model_.clear();
  for (int a = 0; a < kArrays; ++a) {
    model_.push_back({absl::StrCat("layers/", a / 100, "/p", a % 100),
                      DType::kFloat32,
                      {16},
                      Sharding::Replicated(mesh)});
  }
  shards_ = testing::FillShards(model_, backend_->devices());
  auto manager = Open();
  ASSERT_NE(manager, nullptr);
  SaveStep(*manager, 1);
  const int64_t before = ManifestIndex::name_comparisons();
  const SaveInfo second = SaveStep(*manager, 2);  // step 1 is its base
  HostArrays host = WholeArraysInHost(model_);
  absl::StatusOr<RestoreStats> restored = manager->Restore(2, host.targets);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const int64_t comparisons = ManifestIndex::name_comparisons() - before;
  // Array 0 kept its bytes (Train leaves it): it was found in the base.
  EXPECT_GT(second.referenced_bytes, 0);
  // About one comparison per lookup: the base's per array, the restore's
  // per target; a debug build's tables also compare on every insert and
  // lookup to check themselves. A scan per lookup is ~kArrays / 2 each.
  EXPECT_GE(comparisons, kArrays);  // the counter counts these lookups
  EXPECT_LE(comparisons, 10 * kArrays);
}

}  // namespace
}  // namespace hoist
