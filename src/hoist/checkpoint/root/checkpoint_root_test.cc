#include "hoist/checkpoint_root.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hoist/format/layout.h"
#include "hoist/io/memory_storage.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A committed-looking step: a directory with a valid, empty manifest.
void MakeStep(Storage& storage, const std::string& dir, int64_t step) {
  ASSERT_TRUE(storage.CreateDir(dir).ok());
  auto file = storage.OpenWritable(dir + "/MANIFEST.json");
  ASSERT_TRUE(file.ok());
  const std::string text = EncodeManifest({step, "{}", {}, {}}).value();
  ASSERT_TRUE((*file)
                  ->WriteAt(0, absl::MakeSpan(reinterpret_cast<const uint8_t*>(
                                                  text.data()),
                                              text.size()))
                  .ok());
}

TEST(CheckpointRootTest, LockingHoldsForEveryStorage) {
  MemoryStorage memory;
  auto first = CheckpointRoot::Open("/r", &memory);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status second = CheckpointRoot::Open("/r", &memory).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.message(), HasSubstr("in use by another"));
  EXPECT_THAT(second.message(), HasSubstr((*first)->lock_token()));
  EXPECT_TRUE((*first)->CheckLockHolder((*first)->lock_token()).ok());
  EXPECT_EQ((*first)->CheckLockHolder("someone else").code(),
            absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE(CheckpointRoot::Open("/r", &memory).ok());
}

TEST(CheckpointRootTest, ListsStepsByNumberAndIncompleteSaves) {
  MemoryStorage memory;
  auto root = *CheckpointRoot::Open("/r", &memory);
  MakeStep(memory, "/r/" + StepDirName(100000000), 100000000);
  MakeStep(memory, "/r/" + StepDirName(99999999), 99999999);
  ASSERT_TRUE(memory.CreateDir("/r/" + TmpStepDirName(5)).ok());
  ASSERT_TRUE(memory.CreateDir("/r/step_7").ok());  // not a name hoist makes
  EXPECT_THAT(*root->List(), ElementsAre(99999999, 100000000));
  EXPECT_EQ(**root->Latest(), 100000000);
  std::vector<RootEntry> entries = *root->Entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].kind, RootEntry::Kind::kIncomplete);
  EXPECT_EQ(entries[0].step, 5);
  EXPECT_EQ(root->ReadManifest(99999999)->step, 99999999);
  EXPECT_EQ(root->ReadManifest(3).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointRootTest, ReadingTakesNoLockRecoversNothingAndCannotDelete) {
  MemoryStorage memory;
  ASSERT_TRUE(memory.CreateDir("/r").ok());
  MakeStep(memory, "/r/" + StepDirName(1), 1);
  const std::string incomplete = "/r/" + TmpStepDirName(2);
  ASSERT_TRUE(memory.CreateDir(incomplete).ok());
  auto reader = *CheckpointRoot::OpenForReading("/r", &memory);
  EXPECT_TRUE(reader->lock_token().empty());
  EXPECT_TRUE(*memory.Exists(incomplete));
  EXPECT_EQ(reader->Delete(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(CheckpointRoot::Open("/r", &memory).ok());  // no lock held
  EXPECT_EQ(CheckpointRoot::OpenForReading("/none", &memory).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointRootTest, OpeningForWritingRecoversAndDeleteUncommitsFirst) {
  MemoryStorage memory;
  ASSERT_TRUE(memory.CreateDir("/r").ok());
  MakeStep(memory, "/r/" + StepDirName(1), 1);
  // A save that wrote its manifest, and one that did not.
  MakeStep(memory, "/r/" + TmpStepDirName(2), 2);
  ASSERT_TRUE(memory.CreateDir("/r/" + TmpStepDirName(3)).ok());
  auto root = *CheckpointRoot::Open("/r", &memory);
  EXPECT_THAT(*root->List(), ElementsAre(1, 2));
  EXPECT_EQ(root->Entries()->size(), 2u);
  ASSERT_TRUE(root->Delete(1).ok());
  EXPECT_THAT(*root->List(), ElementsAre(2));
  EXPECT_EQ(root->Delete(1).code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointRootTest, SplitStepDirTakesOnlyStepDirectories) {
  EXPECT_EQ(*SplitStepDir("/a/b/step_00000007"),
            std::make_pair(std::string("/a/b"), int64_t{7}));
  EXPECT_EQ(*SplitStepDir("/a/step_00000007/"),
            std::make_pair(std::string("/a"), int64_t{7}));
  EXPECT_EQ(*SplitStepDir("step_00000007"),
            std::make_pair(std::string("."), int64_t{7}));
  EXPECT_EQ(*SplitStepDir("/step_00000007"),
            std::make_pair(std::string("/"), int64_t{7}));
  for (const char* bad : {"/a/b", "/a/step_7", "/a/.step_00000007.tmp-x", ""}) {
    EXPECT_EQ(SplitStepDir(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace hoist
