// Arrivals (arrivals.h): the extents of a lost part checked as the files of
// their sources stream in, in pieces split anywhere.
#include "hoist/checkpoint/tier/arrivals.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hoist/checkpoint/tier/part_files.h"

namespace hoist {
namespace {

std::vector<uint8_t> Bytes(int64_t n, int seed) {
  std::vector<uint8_t> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i + seed);
  return out;
}

class ArrivalsTest : public ::testing::Test {
 protected:
  // A part of four extents (5000, 0, 300 and 9000 bytes); extents 0 and 3
  // come from rank 1's own part, 1 and 2 from rank 2's copy of rank 0's.
  void SetUp() override {
    ManifestArray array;
    array.name = "w";
    for (int i = 0; i < 4; ++i) {
      bytes_.push_back(Bytes(std::vector<int64_t>{5000, 0, 300, 9000}[i], i));
      ManifestExtent extent;
      extent.length_bytes = static_cast<int64_t>(bytes_[i].size());
      extent.hash = HashExtent(bytes_[i].data(), bytes_[i].size());
      array.extents.push_back(std::move(extent));
    }
    part_.arrays.push_back(array);
    sources_.resize(2);
    sources_[0].rank = sources_[0].origin = 1;
    sources_[1].rank = 2;
    sources_[1].origin = 0;
    plan_ = {0, 1, 1, 0};
  }

  // The file a source sends: the extents `indices` packed (PackedOffsets).
  std::vector<uint8_t> FileOf(const std::vector<int>& indices) {
    std::vector<int64_t> lengths;
    for (int i : indices) lengths.push_back(bytes_[i].size());
    const std::vector<int64_t> offsets = PackedOffsets(lengths);
    std::vector<uint8_t> file;
    for (size_t k = 0; k < indices.size(); ++k) {
      file.resize(offsets[k]);
      file.insert(file.end(), bytes_[indices[k]].begin(),
                  bytes_[indices[k]].end());
    }
    return file;
  }

  // Feeds `file` to `arrivals` as `path`, in pieces of `piece` bytes.
  static void Stream(Arrivals& arrivals, const std::string& path,
                     const std::vector<uint8_t>& file, size_t piece) {
    for (size_t at = 0; at < file.size(); at += piece) {
      arrivals.See(path, static_cast<int64_t>(at),
                   {file.data() + at, std::min(piece, file.size() - at)});
    }
  }

  Manifest part_;
  std::vector<std::vector<uint8_t>> bytes_;
  std::vector<ExtentSource> sources_;
  std::vector<int> plan_;
};

TEST_F(ArrivalsTest, ExtentsThatArriveWholeMatchWhereverThePiecesSplit) {
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    Arrivals arrivals(part_, plan_, sources_);
    Stream(arrivals, CopyFileName(1, 1), FileOf({0, 3}), piece);
    Stream(arrivals, CopyFileName(2, 0), FileOf({1, 2}), piece);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(arrivals.matched(i)) << "extent " << i << " piece " << piece;
    }
    EXPECT_EQ(arrivals.file(3), CopyFileName(1, 1));
    EXPECT_EQ(arrivals.offset(0), 0);
    EXPECT_EQ(arrivals.offset(3), 8192);  // after 5000, at 4 KiB alignment
    EXPECT_EQ(arrivals.file(2), CopyFileName(2, 0));
  }
}

TEST_F(ArrivalsTest, AFlippedByteOrAShortFileLeavesItsExtentUnmatched) {
  Arrivals arrivals(part_, plan_, sources_);
  std::vector<uint8_t> own = FileOf({0, 3});
  own[8192 + 100] ^= 1;  // in extent 3
  Stream(arrivals, CopyFileName(1, 1), own, 4000);
  std::vector<uint8_t> copy = FileOf({1, 2});
  copy.resize(copy.size() - 1);  // extent 2's last byte never comes
  Stream(arrivals, CopyFileName(2, 0), copy, 4000);
  EXPECT_TRUE(arrivals.matched(0));
  EXPECT_TRUE(arrivals.matched(1));  // empty: nothing to arrive
  EXPECT_FALSE(arrivals.matched(2));
  EXPECT_FALSE(arrivals.matched(3));
}

}  // namespace
}  // namespace hoist
