// Split manifests (hoist/3): encoded and decoded whole, and read by range
// through Storage (manifest_file.h) so that a reader reads only the head
// and the sections it wants.
#include "hoist/format/manifest_split.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/format/manifest_decode.h"
#include "hoist/format/manifest_file.h"
#include "hoist/io/memory_storage.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr ManifestEncoding kAlwaysSplit{.split_above_extents = 0};

// `arrays` float32 arrays of `extents` × 1,024 elements, each extent in
// its own 4 KiB block of rank `extent`'s file; every other array's bytes
// are step 3's (a delta of step 5).
Manifest Striped(int arrays, int extents) {
  Manifest m;
  m.step = 5;
  m.metadata_json = R"({"run":"wide"})";
  for (int a = 0; a < arrays; ++a) {
    ManifestArray array{absl::StrCat("layer", a, "/w"),
                        DType::kFloat32,
                        {int64_t{extents} * 1024},
                        "P('x')",
                        {}};
    for (int e = 0; e < extents; ++e) {
      array.extents.push_back(ManifestExtent{
          .box = Box({int64_t{e} * 1024}, {1024}),
          .file = absl::StrFormat("data/r%05d_w00.bin", e),
          .offset_bytes = int64_t{a} * 4096,
          .length_bytes = 4096,
          .hash = {.low = uint64_t(a * 1000 + e), .high = 7, .wide = true},
          .step = a % 2 == 1 ? std::optional<int64_t>(3) : std::nullopt});
    }
    m.arrays.push_back(std::move(array));
  }
  return m;
}

TEST(SplitManifestTest, AManifestWithManyExtentsIsSplitAndRoundTrips) {
  const Manifest small = Striped(3, 4);
  EXPECT_THAT(EncodeManifest(small).value(),
              StartsWith("{\"format\": \"hoist/2\""));
  const std::string text = EncodeManifest(small, kAlwaysSplit).value();
  EXPECT_THAT(text, StartsWith(kSplitManifestStart));
  for (auto decode : {DecodeManifest, DecodeManifestDocument}) {
    absl::StatusOr<Manifest> decoded = decode(text);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, small);
  }
  // Above the default threshold, without asking.
  const Manifest large = Striped(2, kSplitManifestExtents / 2 + 1);
  const std::string large_text = EncodeManifest(large).value();
  EXPECT_THAT(large_text, StartsWith(kSplitManifestStart));
  EXPECT_EQ(DecodeManifest(large_text).value(), large);
}

TEST(SplitManifestTest, TheHeadSaysWhatEachArrayHolds) {
  const std::string text = EncodeManifest(Striped(3, 4), kAlwaysSplit).value();
  const size_t head_bytes = SplitHeadBytes(text).value();
  absl::StatusOr<ManifestHead> head =
      DecodeSplitHead(text.substr(0, head_bytes), text.size()).value();
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE(head->split);
  EXPECT_EQ(head->format, kManifestFormatV3);
  ASSERT_EQ(head->sections.size(), 3u);
  EXPECT_EQ(head->sections[1].extents, 4);
  EXPECT_EQ(head->sections[1].bytes, 4 * 4096);
  EXPECT_EQ(head->sections[1].referenced_bytes, 4 * 4096);
  EXPECT_EQ(head->sections[0].referenced_bytes, 0);
  EXPECT_TRUE(head->manifest.arrays[2].extents.empty());
  EXPECT_EQ(head->manifest.metadata_json, R"({"run":"wide"})");
}

TEST(SplitManifestTest, ABlankLineInTheMetadataDoesNotEndTheHead) {
  Manifest m = Striped(2, 2);
  m.metadata_json = "{\"a\":\n\n 1}";
  absl::StatusOr<Manifest> decoded =
      DecodeManifest(EncodeManifest(m, kAlwaysSplit).value());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->metadata_json, R"({"a":1})");
  EXPECT_EQ(decoded->arrays, m.arrays);
}

TEST(SplitManifestTest, ACorruptOrCutSectionIsNamed) {
  const std::string text = EncodeManifest(Striped(3, 4), kAlwaysSplit).value();
  // A digit of array 1's section changed: its hash says so.
  std::string flipped = text;
  const size_t at = flipped.find("\"data/r00002_w00.bin\", \"offset\": 4096");
  ASSERT_NE(at, std::string::npos);
  flipped[at + 36] = '5';
  EXPECT_THAT(DecodeManifest(flipped).status().message(),
              HasSubstr("array 'layer1/w': extents: the "));
  EXPECT_THAT(DecodeManifest(flipped).status().message(),
              HasSubstr("have XXH3-64"));
  EXPECT_EQ(DecodeManifest(text.substr(0, text.size() - 1)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_THAT(
      DecodeManifest(text.substr(0, text.size() - 1)).status().message(),
      HasSubstr("cut short"));
  EXPECT_THAT(DecodeManifest(text + "x").status().message(),
              HasSubstr("bytes after them"));
  // A head without its blank line and sections.
  std::string head_only = text.substr(0, SplitHeadBytes(text).value());
  EXPECT_THAT(DecodeManifest(head_only).status().message(),
              HasSubstr("there is no blank line"));
}

// A Storage that counts the bytes read from the files it opens.
class CountingStorage final : public StorageWrapper {
 public:
  using StorageWrapper::StorageWrapper;
  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    class Counted final : public ReadableFile {
     public:
      Counted(std::unique_ptr<ReadableFile> file, std::atomic<int64_t>& bytes,
              std::atomic<int64_t>& reads)
          : file_(std::move(file)), bytes_(bytes), reads_(reads) {}
      absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
        bytes_ += static_cast<int64_t>(out.size());
        ++reads_;
        return file_->ReadAt(offset, out);
      }
      absl::StatusOr<int64_t> Size() override { return file_->Size(); }

     private:
      std::unique_ptr<ReadableFile> file_;
      std::atomic<int64_t>& bytes_;
      std::atomic<int64_t>& reads_;
    };
    absl::StatusOr<std::unique_ptr<ReadableFile>> file =
        StorageWrapper::OpenReadable(path);
    if (!file.ok()) return file;
    return std::make_unique<Counted>(*std::move(file), bytes_read, reads);
  }
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int64_t> reads{0};
};

class SplitManifestFileTest : public ::testing::Test {
 protected:
  // `manifest` as step_00000005/MANIFEST.json.
  void Write(const Manifest& manifest, const ManifestEncoding& encoding) {
    WriteText(EncodeManifest(manifest, encoding).value());
  }

  // `text` as step_00000005/MANIFEST.json.
  void WriteText(std::string text) {
    text_ = std::move(text);
    ASSERT_TRUE(memory_.CreateDir(kDir).ok());
    std::unique_ptr<WritableFile> file =
        memory_.OpenWritable(absl::StrCat(kDir, "/MANIFEST.json")).value();
    ASSERT_TRUE(
        file->WriteAt(0, absl::Span<const uint8_t>(
                             reinterpret_cast<const uint8_t*>(text_.data()),
                             text_.size()))
            .ok());
    ASSERT_TRUE(file->Sync().ok());
  }

  static constexpr char kDir[] = "step_00000005";
  MemoryStorage memory_;
  CountingStorage counting_{memory_};
  std::string text_;
};

// 40 arrays × 2,000 extents: about 13 MiB of sections behind a head of a
// few KiB.
TEST_F(SplitManifestFileTest, TheHeadAndOneArrayAreReadWithoutTheRest) {
  const Manifest m = Striped(40, 2000);
  Write(m, {});
  ASSERT_THAT(text_, StartsWith(kSplitManifestStart));
  const int64_t section = static_cast<int64_t>(text_.size()) / 40;

  absl::StatusOr<ManifestHead> head = ReadManifestHead(counting_, kDir);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_TRUE(head->split);
  EXPECT_EQ(head->manifest.arrays.size(), 40u);
  EXPECT_EQ(head->sections[7].extents, 2000);
  EXPECT_LE(counting_.bytes_read.load(), 1 << 20);

  counting_.bytes_read = 0;
  absl::StatusOr<Manifest> one =
      ReadManifestArrays(counting_, kDir, {"layer7/w", "not/there"});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->arrays.size(), 1u);
  EXPECT_EQ(one->arrays[0], m.arrays[7]);
  EXPECT_LE(counting_.bytes_read.load(), (1 << 20) + 2 * section);

  // Neighbouring sections in one read, after the head's.
  counting_.bytes_read = 0;
  counting_.reads = 0;
  absl::StatusOr<Manifest> three = ReadManifestArrays(
      counting_, kDir, {"layer10/w", "layer11/w", "layer12/w"});
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->arrays.size(), 3u);
  EXPECT_EQ(counting_.reads.load(), 2);

  absl::StatusOr<Manifest> whole = ReadManifestFile(counting_, kDir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole, m);
}

TEST_F(SplitManifestFileTest, ADocumentIsReadWholeAndFilteredAlike) {
  const Manifest m = Striped(4, 3);
  Write(m, {.split_above_extents = INT64_MAX});
  absl::StatusOr<ManifestHead> head = ReadManifestHead(counting_, kDir);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_FALSE(head->split);
  EXPECT_EQ(head->format, kManifestFormat);
  EXPECT_EQ(head->manifest, m);
  EXPECT_EQ(head->sections[3].referenced_bytes, 3 * 4096);
  absl::StatusOr<Manifest> two =
      ReadManifestArrays(counting_, kDir, {"layer3/w", "layer0/w"});
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->arrays.size(), 2u);
  EXPECT_EQ(two->arrays[0].name, "layer0/w");
  EXPECT_EQ(two->arrays[1], m.arrays[3]);
}

TEST_F(SplitManifestFileTest, ACorruptSectionFailsOnlyTheReadsThatNeedIt) {
  const Manifest m = Striped(3, 4);
  std::string text = EncodeManifest(m, kAlwaysSplit).value();
  const size_t at = text.rfind("\"data/r00003_w00.bin\"");  // array 2's
  text[at + 7] = '9';
  WriteText(text);
  EXPECT_TRUE(ReadManifestArrays(counting_, kDir, {"layer0/w"}).ok());
  const absl::Status whole = ReadManifestFile(counting_, kDir).status();
  EXPECT_EQ(whole.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(whole.message(),
              HasSubstr("step_00000005/MANIFEST.json: array 'layer2/w'"));
}

}  // namespace
}  // namespace hoist
