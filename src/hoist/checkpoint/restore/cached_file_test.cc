#include "hoist/checkpoint/restore/cached_file.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace hoist {
namespace {

// A file of 64 bytes 0..63 that counts the bytes read from it.
class CountingFile final : public ReadableFile {
 public:
  explicit CountingFile(int64_t* read) : read_(read) {}
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    if (offset + static_cast<int64_t>(out.size()) > 64) {
      return absl::DataLossError("past the end");
    }
    for (size_t i = 0; i < out.size(); ++i) out[i] = offset + i;
    *read_ += static_cast<int64_t>(out.size());
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Size() override { return 64; }

 private:
  int64_t* read_;
};

class CachedFileTest : public ::testing::Test {
 protected:
  CachedFileTest() {
    // Bytes 8-15 and 32-39 are in memory, marked (100 + their offset) so
    // that a test sees where each byte came from.
    for (int64_t start : {8, 32}) {
      std::vector<uint8_t>& bytes = memory_[start];
      bytes.resize(8);
      std::iota(bytes.begin(), bytes.end(), static_cast<uint8_t>(100 + start));
      cached_[start] = absl::MakeConstSpan(bytes);
    }
  }
  CachedFile Make() {
    return CachedFile(
        &cached_,
        [this]() -> absl::StatusOr<std::unique_ptr<ReadableFile>> {
          ++opened_;
          return std::make_unique<CountingFile>(&read_);
        },
        &served_);
  }

  std::map<int64_t, std::vector<uint8_t>> memory_;
  std::map<int64_t, absl::Span<const uint8_t>> cached_;
  std::atomic<int64_t> served_{0};
  int64_t read_ = 0;
  int opened_ = 0;
};

TEST_F(CachedFileTest, ARangeInsideTheCacheNeverOpensTheFile) {
  CachedFile file = Make();
  std::vector<uint8_t> out(4);
  ASSERT_TRUE(file.ReadAt(10, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, (std::vector<uint8_t>{110, 111, 112, 113}));
  EXPECT_EQ(opened_, 0);
  EXPECT_EQ(served_.load(), 4);
}

TEST_F(CachedFileTest, ARangeAcrossCachedAndStoredBytesTakesEachFromItsPlace) {
  CachedFile file = Make();
  std::vector<uint8_t> out(36);  // 6-41: stored, cached, stored, cached, ...
  ASSERT_TRUE(file.ReadAt(6, absl::MakeSpan(out)).ok());
  for (int64_t at = 6; at < 42; ++at) {
    const bool cached = (at >= 8 && at < 16) || (at >= 32 && at < 40);
    EXPECT_EQ(out[at - 6], cached ? 100 + at : at) << "byte " << at;
  }
  EXPECT_EQ(served_.load(), 16);
  EXPECT_EQ(read_, 20);
  EXPECT_EQ(opened_, 1);
}

TEST_F(CachedFileTest, TheStoredFilesErrorsComeThrough) {
  CachedFile file = Make();
  std::vector<uint8_t> out(8);
  EXPECT_EQ(file.ReadAt(60, absl::MakeSpan(out)).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace hoist
