#include "hoist/format/layout.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_format.h"
#include "hoist/base/xxh3.h"

namespace hoist {
namespace {

TEST(LayoutTest, StepDirectoriesHaveOneSpelling) {
  for (int64_t step : {int64_t{0}, int64_t{7}, int64_t{99999999},
                       int64_t{100000000}, int64_t{1} << 40}) {
    EXPECT_EQ(ParseStepDirName(StepDirName(step)), step);
  }
  EXPECT_EQ(StepDirName(7), "step_00000007");
  for (const char* bad : {"step_7", "step_000000007", "step_0000000a",
                          "step_-0000001", "xstep_00000007", ""}) {
    EXPECT_EQ(ParseStepDirName(bad), std::nullopt) << bad;
  }
}

TEST(LayoutTest, TemporaryNamesRoundTripWithTheirRole) {
  const std::string save = TmpStepDirName(42);
  ASSERT_TRUE(ParseTmpStepDirName(save).has_value());
  EXPECT_EQ(ParseTmpStepDirName(save)->step, 42);
  EXPECT_EQ(ParseTmpStepDirName(save)->kind, TmpKind::kSave);
  EXPECT_EQ(ParseTmpStepDirName(save + kAsideSuffix)->kind, TmpKind::kAside);
  EXPECT_EQ(ParseTmpStepDirName(save + kDeletingSuffix)->kind,
            TmpKind::kDeleting);
  EXPECT_NE(TmpStepDirName(42), TmpStepDirName(42));  // a fresh nonce
  for (const std::string& bad :
       {save + ".x", save.substr(0, save.size() - 1), std::string("step_1"),
        std::string(".step_00000001.tmp-0123456789ABCDEF"),
        std::string(".step_1.tmp-0123456789abcdef"),
        std::string(".step_00000001.tmp-0123456789abcdef/..")}) {
    EXPECT_FALSE(ParseTmpStepDirName(bad).has_value()) << bad;
  }
}

TEST(LayoutTest, DataFilesAndTheStepOfADirectory) {
  EXPECT_EQ(DataFileName(1, 2), "data/r00001_w02.bin");
  // Spread: under the prefix of the name's XXH3-64's high byte, a scheme
  // readers never recompute (the manifest names each file) but that must
  // not change under a running job's ranks.
  const std::string name = "r00001_w02.bin";
  EXPECT_EQ(DataFileName(1, 2, /*spread=*/true),
            absl::StrFormat("data/%02x/%s",
                            XXH3_64bits(name.data(), name.size()) >> 56, name));
  EXPECT_EQ(StepOfDir("/r/step_00000003"), 3);
  EXPECT_EQ(StepOfDir("/r/step_00000003/"), 3);
  EXPECT_EQ(StepOfDir("/r/" + TmpStepDirName(4) + kAsideSuffix), 4);
  EXPECT_EQ(StepOfDir("/r/other"), std::nullopt);
}

}  // namespace
}  // namespace hoist
