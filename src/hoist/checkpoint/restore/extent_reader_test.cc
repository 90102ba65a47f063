#include "hoist/checkpoint/restore/extent_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"
#include "hoist/box.h"
#include "hoist/format/extent_hash.h"
#include "hoist/io/memory_storage.h"
#include "testing/recording_file.h"
#include "testing/smaps.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

// Every piece is at most `max` bytes (or one element), the pieces tile the
// box in order, and each is the contiguous run of the box's bytes that
// starts where the previous one ended.
void ExpectContiguousPieces(const Box& box, int64_t item, int64_t max,
                            size_t expected_pieces) {
  std::vector<uint8_t> bytes(box.num_elements() * item);
  std::iota(bytes.begin(), bytes.end(), uint8_t{0});
  std::vector<Box> pieces;
  ASSERT_TRUE(ForEachContiguousPiece(box, item, max, [&](const Box& piece) {
                pieces.push_back(piece);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(pieces.size(), expected_pieces) << box.ToString();
  int64_t offset = 0;
  for (const Box& piece : pieces) {
    const int64_t size = piece.num_elements() * item;
    EXPECT_LE(size, std::max(max, item)) << piece.ToString();
    std::vector<uint8_t> copied(size);
    CopyBox(bytes.data(), box, copied.data(), piece, piece, item);
    ASSERT_LE(offset + size, static_cast<int64_t>(bytes.size()));
    EXPECT_TRUE(
        std::equal(copied.begin(), copied.end(), bytes.begin() + offset))
        << piece.ToString() << " is not the run at " << offset;
    offset += size;
  }
  EXPECT_EQ(offset, static_cast<int64_t>(bytes.size()));
}

TEST(ContiguousPiecesTest, WholeRowsOfTheFirstAxis) {
  ExpectContiguousPieces(Box({0, 0}, {4, 6}), 4, 48, 2);
  ExpectContiguousPieces(Box({3, 5}, {5, 6}), 4, 48, 3);  // 2 + 2 + 1 rows
  ExpectContiguousPieces(Box({0, 0}, {4, 6}), 4, 1 << 20, 1);
}

TEST(ContiguousPiecesTest, RowsLargerThanAPieceAreSplitFurther) {
  // Rows of 4,000 bytes, pieces of 1,000: each row in 4 pieces.
  ExpectContiguousPieces(Box({0, 0, 0}, {1, 3, 1000}), 4, 1000, 12);
  // Smaller than one element: one element a piece.
  ExpectContiguousPieces(Box({0, 0}, {2, 3}), 8, 1, 6);
  ExpectContiguousPieces(Box({}, {}), 4, 1, 1);  // a scalar
}

// A manifest may claim 2^36 pieces: they are made one at a time, and the
// first error stops the walk.
TEST(ContiguousPiecesTest, PiecesAreMadeOneAtATime) {
  const Box huge({0, 0}, {int64_t{1} << 38, int64_t{1} << 20});
  int visited = 0;
  absl::Status status =
      ForEachContiguousPiece(huge, 4, int64_t{16} << 20, [&](const Box& piece) {
        ++visited;
        EXPECT_EQ(piece.shape()[0], 4);  // 4 rows of 4 MiB
        return visited == 3 ? absl::DataLossError("stop") : absl::OkStatus();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(visited, 3);
}

TEST(ExtentReaderTest, PiecesHashLikeTheWholeAndMismatchIsDataLoss) {
  MemoryStorage storage;
  std::vector<uint8_t> bytes(10 * 300 * 4);
  std::iota(bytes.begin(), bytes.end(), uint8_t{1});
  {
    auto file = *storage.OpenWritable("/f");
    ASSERT_TRUE(file->WriteAt(8192, bytes).ok());
  }
  ManifestExtent extent{Box({0, 0}, {10, 300}),
                        "f",
                        8192,
                        static_cast<int64_t>(bytes.size()),
                        HashExtent(bytes.data(), bytes.size()),
                        std::nullopt};
  auto file = *storage.OpenReadable("/f");
  ReadBuffer buffer;
  std::vector<uint8_t> seen;
  int pieces = 0;
  ASSERT_TRUE(ReadExtentInPieces(*file, extent, 4, 2400, buffer,
                                 [&](const Box& box, const uint8_t* data) {
                                   seen.insert(seen.end(), data,
                                               data + box.num_elements() * 4);
                                   ++pieces;
                                 })
                  .ok());
  EXPECT_EQ(pieces, 5);
  EXPECT_EQ(seen, bytes);

  extent.hash.high ^= 1;
  absl::Status status = ReadExtentInPieces(*file, extent, 4, 2400, buffer,
                                           [](const Box&, const uint8_t*) {});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("xxh3 mismatch in f @ 8192"));
  // It names the manifest's hash, never the hash of the bytes read.
  const std::string actual =
      FormatExtentHash(HashExtent(bytes.data(), bytes.size()));
  EXPECT_THAT(status.message(), ::testing::Not(HasSubstr(actual)));

  extent.offset_bytes = 16384;  // past the end: refused before reading
  status = ReadExtentInPieces(*file, extent, 4, 2400, buffer,
                              [](const Box&, const uint8_t*) { FAIL(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("runs past the end of f"));
}

// A reader's buffer is advised for huge pages everywhere, as the pool is
// (AdviseHugePagesForIo): every read of a restore goes through it, and
// direct reads into huge pages are larger requests.
TEST(ReadBufferTest, IsAdvisedForHugePagesEverywhere) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  ReadBuffer buffer;
  const uint8_t* data = buffer.Get(4096);
  EXPECT_THAT(testing::SmapsField(data, "VmFlags"), HasSubstr(" hg"));
}

// Pieces start and end anywhere; each is read as the whole 4 KiB blocks
// around it (so POSIX storage reads it O_DIRECT), up to the file's end.
TEST(ExtentReaderTest, PiecesAreReadAsWholeBlocks) {
  MemoryStorage storage;
  std::vector<uint8_t> bytes(10 * 3000 * 4);  // rows of 12,000 bytes
  std::iota(bytes.begin(), bytes.end(), uint8_t{3});
  const int64_t at = 8192 + 4096;
  {
    auto file = *storage.OpenWritable("/f");
    ASSERT_TRUE(file->WriteAt(at, bytes).ok());
    const std::vector<uint8_t> after(5000, 7);  // the file goes on
    ASSERT_TRUE(file->WriteAt(at + bytes.size(), after).ok());
  }
  const int64_t file_bytes = at + static_cast<int64_t>(bytes.size()) + 5000;
  for (const int64_t tail : {int64_t{5000}, int64_t{0}}) {
    if (tail == 0) {  // the extent ends the file
      auto file = *storage.OpenWritable("/g");
      ASSERT_TRUE(file->WriteAt(at, bytes).ok());
    }
    testing::ReadLog log;
    testing::RecordingFile file(*storage.OpenReadable(tail > 0 ? "/f" : "/g"),
                                log);
    const ManifestExtent extent{Box({0, 0}, {10, 3000}),
                                tail > 0 ? "f" : "g",
                                at,
                                static_cast<int64_t>(bytes.size()),
                                HashExtent(bytes.data(), bytes.size()),
                                std::nullopt};
    ReadBuffer buffer;
    std::vector<uint8_t> seen;
    ASSERT_TRUE(ReadExtentInPieces(file, extent, 4, 36000, buffer,
                                   [&](const Box& box, const uint8_t* data) {
                                     seen.insert(seen.end(), data,
                                                 data + box.num_elements() * 4);
                                   })
                    .ok());
    EXPECT_EQ(seen, bytes);
    const std::vector<testing::RecordedRead> reads = log.reads();
    ASSERT_EQ(reads.size(), 4u);  // 3 + 3 + 3 + 1 rows
    const int64_t end = tail > 0 ? file_bytes : at + bytes.size();
    for (const testing::RecordedRead& read : reads) {
      EXPECT_EQ(read.offset % 4096, 0) << read.offset;
      EXPECT_TRUE((read.offset + read.bytes) % 4096 == 0 ||
                  read.offset + read.bytes == end)
          << read.offset << " + " << read.bytes;
    }
    // The last piece's read stops at the file's end.
    EXPECT_EQ(reads.back().offset + reads.back().bytes,
              std::min(end, AlignUp(at + static_cast<int64_t>(bytes.size()),
                                    int64_t{4096})));
  }
}

}  // namespace
}  // namespace hoist
