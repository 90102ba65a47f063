// CheckpointManager: what Open finds in a root. Its lock, the debris of
// crashed saves (collected, or committed when the manifest was written),
// what a hostile user leaves there, a power cut at every sync point, and
// committed steps never saved over.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_format.h"
#include "hoist/checkpoint_manager.h"
#include "hoist/format/layout.h"
#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "hoist/storage.h"
#include "testing/manager_test.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ManagerTest;

TEST_F(ManagerTest, SecondManagerOnTheSameRootIsRefused) {
  auto first = Open();
  CheckpointManagerOptions small;
  small.pool_bytes = 64 * 1024;
  absl::StatusOr<std::unique_ptr<CheckpointManager>> second =
      CheckpointManager::Open(root_, *backend_, *coordinator_, small);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another"));
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrFormat("held by pid %d on ", getpid())));
  first.reset();
  EXPECT_TRUE(
      CheckpointManager::Open(root_, *backend_, *coordinator_, small).ok());
}

// The lock goes through Storage, so an injected storage is locked too.
TEST_F(ManagerTest, SecondManagerOnAnInjectedStorageIsRefused) {
  MemoryStorage memory;
  auto first = Open({}, &memory);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<CheckpointManager>> second =
      CheckpointManager::Open(root_, *backend_, *coordinator_, SmallPool(),
                              &memory);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another"));
  first.reset();
  EXPECT_TRUE(CheckpointManager::Open(root_, *backend_, *coordinator_,
                                      SmallPool(), &memory)
                  .ok());
}

TEST_F(ManagerTest, OpenRemovesStaleTemporaryDirectories) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  }
  std::unique_ptr<Storage> posix = MakePosixStorage();
  ASSERT_TRUE(posix->CreateDir(root_ + "/" + TmpStepDirName(2)).ok());
  auto manager = Open();
  std::vector<std::string> names = *posix->List(root_);
  EXPECT_THAT(names, ElementsAre(".hoist.lock", "step_00000001"));
}

TEST_F(ManagerTest, OpenCommitsASaveThatCrashedAfterItsManifest) {
  {
    auto manager = Open();
    testing::Refill(model_, shards_, 7);
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  }
  // As if the process died between the manifest and the rename.
  std::unique_ptr<Storage> posix = MakePosixStorage();
  ASSERT_TRUE(posix
                  ->Rename(root_ + "/step_00000001",
                           root_ + "/.step_00000001.tmp-00000000deadbeef")
                  .ok());
  auto manager = Open();
  EXPECT_THAT(*manager->List(), ElementsAre(1));
  ExpectHolds(*manager, 1, 7);
}

TEST_F(ManagerTest, OpenBringsBackAStepAnOverwriteHadMovedAside) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  }
  std::unique_ptr<Storage> posix = MakePosixStorage();
  ASSERT_TRUE(posix
                  ->Rename(root_ + "/step_00000001",
                           root_ + "/.step_00000001.tmp-0000000000000001.old")
                  .ok());
  auto manager = Open();
  EXPECT_THAT(*manager->List(), ElementsAre(1));
  ExpectHolds(*manager, 1, 0);
}

// A root is input. What a hostile user can leave in it never makes Open
// crash, hang, commit through a link or write outside the root.
TEST_F(ManagerTest, LockFileThatIsALinkIsRefusedAndItsTargetKept) {
  testing::TempDir outside;
  const std::string target = outside.path() + "/precious";
  { std::ofstream(target) << "keep me"; }
  std::filesystem::create_directories(root_);
  std::filesystem::create_symlink(target, root_ + "/.hoist.lock");
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, *backend_, *coordinator_, SmallPool());
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(manager.status().message(), HasSubstr("symbolic link"));
  std::ifstream in(target);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "keep me");
}

TEST_F(ManagerTest, LockFileIsPrivateAndAFifoInItsPlaceIsRefused) {
  { auto manager = Open(); }
  struct stat st;
  ASSERT_EQ(stat((root_ + "/.hoist.lock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  std::filesystem::remove(root_ + "/.hoist.lock");
  ASSERT_EQ(mkfifo((root_ + "/.hoist.lock").c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Open(root_, *backend_, *coordinator_, SmallPool());
  EXPECT_EQ(manager.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(manager.status().message(), HasSubstr("must be a regular file"));
}

TEST_F(ManagerTest, RecoveryRemovesATemporaryLinkInsteadOfCommittingIt) {
  testing::TempDir outside;
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(2, Arrays()).ok());
  }
  // A complete step 2 outside the root, linked in under a save's name.
  std::filesystem::rename(root_ + "/step_00000002", outside.path() + "/step");
  const std::string link = root_ + "/.step_00000002.tmp-00000000deadbeef";
  std::filesystem::create_directory_symlink(outside.path() + "/step", link);
  auto manager = Open();
  EXPECT_TRUE(manager->List()->empty());
  EXPECT_FALSE(std::filesystem::is_symlink(link));
  EXPECT_TRUE(std::filesystem::exists(outside.path() + "/step/MANIFEST.json"));
}

TEST_F(ManagerTest, ACommittedStepThatIsALinkIsNeverReadThrough) {
  testing::TempDir outside;
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  }
  std::filesystem::rename(root_ + "/step_00000001", outside.path() + "/s");
  std::filesystem::create_directory_symlink(outside.path() + "/s",
                                            root_ + "/step_00000001");
  auto manager = Open();
  absl::Status restored = manager->Restore(1, {}).status();
  EXPECT_EQ(restored.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.message(), HasSubstr("not a directory (a link"));
  EXPECT_EQ(manager->Verify(1).status().code(), absl::StatusCode::kDataLoss);
  // Deleting it removes the link, not what it points to.
  ASSERT_TRUE(manager->Delete(1).ok());
  EXPECT_FALSE(std::filesystem::is_symlink(root_ + "/step_00000001"));
  EXPECT_TRUE(std::filesystem::exists(outside.path() + "/s/MANIFEST.json"));
}

TEST_F(ManagerTest, RecoveryNeverCommitsAManifestOfAnotherStep) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(1, Arrays()).ok());
  }
  // Step 1's complete directory, under step 7's temporary name.
  std::filesystem::rename(root_ + "/step_00000001",
                          root_ + "/.step_00000007.tmp-00000000deadbeef");
  auto manager = Open();
  EXPECT_TRUE(manager->List()->empty());
}

TEST_F(ManagerTest, DeeplyNestedManifestInATemporaryDirectoryIsDebris) {
  const std::string tmp = root_ + "/.step_00000003.tmp-00000000deadbeef";
  std::filesystem::create_directories(tmp);
  {
    std::ofstream out(tmp + "/MANIFEST.json");
    out << R"({"format": "hoist/1", "step": 3, "arrays": [], "metadata": {"x":)"
        << std::string(100000, '[') << std::string(100000, ']') << "}}";
  }
  auto manager = Open();
  ASSERT_NE(manager, nullptr);
  EXPECT_TRUE(manager->List()->empty());
  EXPECT_FALSE(std::filesystem::exists(tmp));
}

// The whole life of a root on the crash model: creating it (and its
// parents), locking, recovering, saving, retention and delete, with a power
// cut at every sync point. Every step acknowledged as committed (and not
// deleted since) is there after the cut, and restores bit-exact.
TEST_F(ManagerTest, CrashAtEverySyncOverTheLifeOfARootLosesNoAcknowledgedStep) {
  root_ = "/jobs/run1/ckpt";
  int crashes = 0;
  for (int sync = 0;; ++sync) {
    MemoryStorage memory;
    FaultInjectingStorage faulty(memory, {.crash_at_sync = sync});
    std::set<int64_t> acknowledged;
    {
      absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
          CheckpointManager::Open(root_, *backend_, *coordinator_,
                                  SmallPool(/*keep_last=*/2), &faulty);
      for (int64_t step = 1; manager.ok() && step <= 4; ++step) {
        testing::Refill(model_, shards_, step);
        absl::StatusOr<SaveHandle> handle = (*manager)->Save(step, Arrays());
        if (!handle.ok() || !handle->WaitCommitted().ok()) break;
        acknowledged.insert(step);
        if (step > 2) acknowledged.erase(step - 2);  // retention
        if (step == 4) {
          if (!(*manager)->Delete(3).ok()) break;
          acknowledged.erase(3);
        }
      }
    }
    const bool crashed = faulty.crashed();
    memory.Crash();
    if (crashed) ++crashes;
    auto manager = Open({}, &memory);  // the restart
    ASSERT_NE(manager, nullptr) << "sync " << sync;
    const std::vector<int64_t> steps = *manager->List();
    for (int64_t step : acknowledged) {
      EXPECT_THAT(steps, ::testing::Contains(step)) << "sync " << sync;
      ExpectHolds(*manager, step, step);
    }
    if (!crashed) break;  // got past every sync point
  }
  EXPECT_GE(crashes, 10);
}

// Save refuses a committed step: one the root held at Open, and one this
// manager saved. One put in the root behind its back, above every step it
// knew (Save no longer asks storage about those on the caller's thread), is
// refused by the saver before it writes, and left as it was.
TEST_F(ManagerTest, ACommittedStepIsNeverSavedOver) {
  {
    auto manager = Open();
    ASSERT_TRUE(manager->Save(5, Arrays()).ok());
    ASSERT_TRUE(manager->WaitUntilFinished().ok());
  }
  auto manager = Open();
  EXPECT_EQ(manager->Save(5, Arrays()).status().code(),
            absl::StatusCode::kAlreadyExists);
  testing::Refill(model_, shards_, 7);
  ASSERT_TRUE(manager->Save(7, Arrays()).ok());
  ASSERT_TRUE(manager->WaitUntilFinished().ok());
  EXPECT_EQ(manager->Save(7, Arrays()).status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(manager->Save(3, Arrays()).ok());  // below them, and free
  ASSERT_TRUE(manager->WaitUntilFinished().ok());

  std::filesystem::copy(root_ + "/" + StepDirName(7),
                        root_ + "/" + StepDirName(9),
                        std::filesystem::copy_options::recursive);
  testing::Refill(model_, shards_, 9);
  // The saver's refusal reaches Save when it comes before the copies are
  // dispatched, else WaitUntilFinished: it is reported once, by one of them.
  const absl::Status saved = manager->Save(9, Arrays()).status();
  const absl::Status finished = manager->WaitUntilFinished();
  EXPECT_NE(saved.ok(), finished.ok()) << saved << " / " << finished;
  const absl::Status& status = saved.ok() ? finished : saved;
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("step 9 is already committed"));
  EXPECT_THAT(*manager->List(), ElementsAre(3, 5, 7, 9));
  const auto manifest = [&](int64_t step) {
    std::ifstream in(root_ + "/" + StepDirName(step) + "/MANIFEST.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(manifest(9), manifest(7));  // the copy, untouched
  ExpectHolds(*manager, 7, 7);
  ExpectHolds(*manager, 5, 0);
}

}  // namespace
}  // namespace hoist
