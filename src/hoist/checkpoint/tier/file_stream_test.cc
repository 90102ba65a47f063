// FileStream (file_stream.h): the files a peer streams, written in order
// from pieces split anywhere, their bytes seen in order, on real files.
#include "hoist/checkpoint/tier/file_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "hoist/storage.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> Pattern(size_t bytes, int seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i)
    out[i] = static_cast<uint8_t>(i * 7 + seed);
  return out;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file whose writes fail from the `fail_at`-th on.
class FailingFile : public WritableFile {
 public:
  explicit FailingFile(int fail_at) : fail_at_(fail_at) {}
  absl::Status WriteAt(int64_t, absl::Span<const uint8_t>) override {
    return ++writes_ >= fail_at_ ? absl::ResourceExhaustedError("disk full")
                                 : absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }

 private:
  const int fail_at_;
  int writes_ = 0;
};

class FileStreamTest : public ::testing::Test {
 protected:
  // Files of `sizes` under the temp dir, opened for writing.
  std::vector<std::unique_ptr<WritableFile>> Open(
      const std::vector<int64_t>& sizes, std::vector<std::string>& paths) {
    std::vector<std::unique_ptr<WritableFile>> files;
    for (size_t f = 0; f < sizes.size(); ++f) {
      paths.push_back(dir_.path() + "/f" + std::to_string(f));
      files.push_back(*storage_->OpenWritable(paths.back()));
    }
    return files;
  }

  testing::TempDir dir_;
  std::unique_ptr<Storage> storage_ = MakePosixStorage();
};

TEST_F(FileStreamTest, PiecesSplitAnywhereMakeEveryFileWholeAndAreSeenInOrder) {
  // Sizes around the staging buffer's and the 4 KiB alignment, an empty
  // file among them; pieces of odd sizes cut across the files.
  const std::vector<int64_t> sizes = {
      5, 0, static_cast<int64_t>(FileStream::kStagingBytes) + 4097, 4096,
      3 * static_cast<int64_t>(FileStream::kStagingBytes) - 1};
  std::vector<std::string> paths;
  std::vector<std::unique_ptr<WritableFile>> files = Open(sizes, paths);
  std::vector<uint8_t> stream;
  for (size_t f = 0; f < sizes.size(); ++f) {
    std::vector<uint8_t> bytes = Pattern(sizes[f], static_cast<int>(f));
    stream.insert(stream.end(), bytes.begin(), bytes.end());
  }
  std::vector<std::string> seen_paths;
  std::vector<int64_t> seen_next(sizes.size(), 0);
  bool in_order = true;
  const ReceivedBytes seen = [&](const std::string& path, int64_t offset,
                                 absl::Span<const uint8_t> bytes) {
    const size_t f = std::stoul(path.substr(path.rfind('f') + 1));
    in_order &= offset == seen_next[f];
    seen_next[f] = offset + static_cast<int64_t>(bytes.size());
  };
  FileStream out(std::move(files), paths, sizes, seen);
  size_t at = 0, piece = 1;
  while (at < stream.size()) {
    const size_t n = std::min(piece, stream.size() - at);
    ASSERT_TRUE(out.Append({stream.data() + at, n}).ok());
    at += n;
    piece = piece * 3 + 1;  // 1, 4, 13, ... up to several MiB
  }
  ASSERT_TRUE(out.Finish().ok());
  ASSERT_TRUE(out.Close().ok());
  EXPECT_TRUE(in_order);
  for (size_t f = 0; f < sizes.size(); ++f) {
    EXPECT_EQ(seen_next[f], sizes[f]) << f;
    EXPECT_EQ(ReadAll(paths[f]), Pattern(sizes[f], static_cast<int>(f))) << f;
  }
}

TEST_F(FileStreamTest, BytesPastTheFilesAreDataLoss) {
  std::vector<std::string> paths;
  FileStream out(Open({10}, paths), paths, {10}, nullptr);
  const std::vector<uint8_t> bytes(11, 1);
  const absl::Status status = out.Append(bytes);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_TRUE(out.Close().ok());
}

TEST_F(FileStreamTest, AWriteThatFailsFailsTheStreamAndNothingHangs) {
  // The second write fails: a later Append (or Finish) returns its error,
  // whichever the writer thread reached first.
  std::vector<std::unique_ptr<WritableFile>> files;
  files.push_back(std::make_unique<FailingFile>(2));
  const int64_t size = 8 * static_cast<int64_t>(FileStream::kStagingBytes);
  FileStream out(std::move(files), {"data/x"}, {size}, nullptr);
  const std::vector<uint8_t> piece(FileStream::kStagingBytes, 2);
  absl::Status status;
  for (int i = 0; i < 8 && status.ok(); ++i) status = out.Append(piece);
  if (status.ok()) status = out.Finish();
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("disk full"));
  EXPECT_TRUE(absl::IsResourceExhausted(out.Close()));
}

}  // namespace
}  // namespace hoist
