#include "hoist/format/references_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hoist/io/memory_storage.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Manifest WithReferences() {
  Manifest m;
  m.step = 7;
  ManifestArray a;
  a.name = "w";
  ManifestExtent own;
  own.file = "data/r00000_w00.bin";
  ManifestExtent old;
  old.step = 3;
  old.file = "data/r00000_w00.bin";
  ManifestExtent older = old;
  older.step = 1;
  older.file = "data/r00001_w00.bin";
  a.extents = {own, old, older, old};
  m.arrays = {a};
  return m;
}

TEST(ReferencesFileTest, ListsEachFileOfAnotherStepOnceAndRoundTrips) {
  const std::vector<std::string> files = FilesReferenced(WithReferences());
  EXPECT_THAT(files, ElementsAre("step_00000001/data/r00001_w00.bin",
                                 "step_00000003/data/r00000_w00.bin"));
  const std::string text = EncodeReferences(7, files);
  EXPECT_THAT(text, HasSubstr("\"format\":\"hoist-references/1\""));
  EXPECT_EQ(*DecodeReferences(text, 7), files);
  EXPECT_TRUE(DecodeReferences(EncodeReferences(7, {}), 7)->empty());
}

TEST(ReferencesFileTest, AnythingThatDoesNotCheckIsDataLoss) {
  const std::string good =
      EncodeReferences(7, {"step_00000003/data/r00000_w00.bin"});
  std::string flipped = good;
  flipped[flipped.find("r00000")] = 's';  // a file the hash does not cover
  std::string hash = good;
  hash[hash.rfind('"') - 1] ^= 1;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {flipped, "do not match their xxh3"},
      {hash, "do not match their xxh3"},
      {EncodeReferences(8, {"step_00000003/data/r00000_w00.bin"}),
       "another step"},
      {EncodeReferences(7, {"step_00000007/data/r00000_w00.bin"}),
       "not a file of another step"},
      {EncodeReferences(7, {"step_00000003/../x.bin"}),
       "not a file of another step"},
      {EncodeReferences(7, {"/etc/passwd"}), "not a file of another step"},
      {EncodeReferences(7, {"step_00000003/b", "step_00000003/a"}),
       "not sorted"},
      {R"({"format": "hoist/2", "step": 7})", "not hoist-references/1"},
  };
  for (const auto& [text, why] : bad) {
    absl::StatusOr<std::vector<std::string>> decoded =
        DecodeReferences(text, 7);
    ASSERT_FALSE(decoded.ok()) << text;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(decoded.status().message(), HasSubstr(why)) << text;
  }
}

TEST(ReferencesFileTest, WrittenAndReadThroughStorage) {
  MemoryStorage storage;
  ASSERT_TRUE(storage.CreateDirs("/r/step_00000007").ok());
  EXPECT_EQ(ReadReferencesFile(storage, "/r/step_00000007", 7).status().code(),
            absl::StatusCode::kNotFound);
  const std::vector<std::string> files = FilesReferenced(WithReferences());
  ASSERT_TRUE(WriteReferencesFile(storage, "/r/step_00000007", 7, files).ok());
  EXPECT_EQ(*ReadReferencesFile(storage, "/r/step_00000007", 7), files);
  EXPECT_EQ(ReadReferencesFile(storage, "/r/step_00000007", 6).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace hoist
