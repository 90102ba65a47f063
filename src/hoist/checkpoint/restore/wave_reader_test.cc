#include "hoist/checkpoint/restore/wave_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hoist/base/checked_math.h"
#include "hoist/format/extent_hash.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBlock = 4096;

// A data file in memory: reads at `held_at` wait for `release`, and reads
// at `failing_at` fail.
class MemoryFile final : public ReadableFile {
 public:
  MemoryFile(const std::vector<uint8_t>& bytes, int64_t held_at,
             Notification* release, int64_t failing_at)
      : bytes_(bytes),
        held_at_(held_at),
        release_(release),
        failing_at_(failing_at) {}
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    if (offset == held_at_) release_->WaitForNotification();
    if (offset == failing_at_) return absl::UnavailableError("disk gone");
    if (offset + static_cast<int64_t>(out.size()) >
        static_cast<int64_t>(bytes_.size())) {
      return absl::DataLossError("past the end");
    }
    std::memcpy(out.data(), bytes_.data() + offset, out.size());
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Size() override {
    return static_cast<int64_t>(bytes_.size());
  }

 private:
  const std::vector<uint8_t>& bytes_;
  const int64_t held_at_;
  Notification* const release_;
  const int64_t failing_at_;
};

// An array of `extents` rows of 1024 floats, one extent per row, each in a
// 4 KiB block of its own in one file, and a wave per `rows_per_wave` rows,
// each row an image of its own in host memory.
class ReaderCrewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    array_.name = "w";
    array_.dtype = DType::kFloat32;
    array_.shape = {kRows, 1024};
    file_bytes_.resize(kRows * kBlock);
    for (int64_t i = 0; i < static_cast<int64_t>(file_bytes_.size()); ++i) {
      file_bytes_[i] = static_cast<uint8_t>(i * 7 + i / kBlock);
    }
    for (int64_t row = 0; row < kRows; ++row) {
      ManifestExtent extent;
      extent.box = Box({row, 0}, {1, 1024});
      extent.file = "data/r00000_w00.bin";
      extent.offset_bytes = row * kBlock;
      extent.length_bytes = kBlock;
      extent.hash = HashExtent(file_bytes_.data() + row * kBlock, kBlock);
      array_.extents.push_back(extent);
    }
    rows_.assign(kRows, std::vector<uint8_t>(kBlock));
  }

  // Rows [first, first + count) as one wave.
  std::unique_ptr<WaveReads> Wave(int first, int count) {
    std::vector<ReadTask> tasks;
    std::vector<WaveImage> images;
    for (int row = first; row < first + count; ++row) {
      tasks.push_back({&array_, row, {row - first}});
      images.push_back({array_.extents[row].box, rows_[row].data(), false});
    }
    return std::make_unique<WaveReads>(std::move(tasks), std::move(images),
                                       true);
  }

  ExtentFileOpener Opener(int64_t held_at, int64_t failing_at) {
    return [this, held_at, failing_at](const ExtentPlace&) {
      return absl::StatusOr<std::unique_ptr<ReadableFile>>(
          std::make_unique<MemoryFile>(file_bytes_, held_at, &release_,
                                       failing_at));
    };
  }

  void ExpectRows(int first, int count) {
    for (int row = first; row < first + count; ++row) {
      EXPECT_EQ(std::memcmp(rows_[row].data(),
                            file_bytes_.data() + row * kBlock, kBlock),
                0)
          << "row " << row;
    }
  }

  static constexpr int64_t kRows = 6;
  ManifestArray array_;
  std::vector<uint8_t> file_bytes_;
  std::vector<std::vector<uint8_t>> rows_;
  Notification release_;
  const std::string step_dir_ = "/nowhere/step_00000001";
};

// Rows far apart in the file are runs of their own: with two readers and a
// read of wave 0 held, the other reader reads all of wave 1, which a crew
// joining its readers after each wave would never start.
TEST_F(ReaderCrewTest, ReadersGoOnToTheNextWaveWhileAReadOfTheLastIsHeld) {
  // Rows 0 and 2 in wave 0; rows 3 to 5 in wave 1 (row 1 is left out, so
  // rows 0 and 2 are not neighbours: two runs).
  std::vector<ReadTask> tasks = {{&array_, 0, {0}}, {&array_, 2, {1}}};
  std::vector<WaveImage> images = {
      {array_.extents[0].box, rows_[0].data(), false},
      {array_.extents[2].box, rows_[2].data(), false}};
  const WaveReads first(std::move(tasks), std::move(images), true);
  ASSERT_EQ(first.runs(), 2u);
  const std::unique_ptr<WaveReads> second = Wave(3, 3);
  const ExtentFileOpener open = Opener(/*held_at=*/0, /*failing_at=*/-1);
  const ReadContext context{&open, &step_dir_, true};
  std::vector<ReadBuffer> buffers(2);
  ReaderCrew crew(context, buffers);
  const int w0 = crew.Add(first);
  const int w1 = crew.Add(*second);
  EXPECT_TRUE(crew.Wait(w1).ok());
  ExpectRows(3, 3);
  EXPECT_EQ(crew.taken(w0).load(), 2u);
  release_.Notify();
  EXPECT_TRUE(crew.Wait(w0).ok());
  ExpectRows(0, 1);
  ExpectRows(2, 1);
  EXPECT_EQ(crew.bytes_read(), 5 * kBlock);
}

TEST_F(ReaderCrewTest, AFailedReadFailsEveryWaitAndStopLeavesNoReadBehind) {
  release_.Notify();
  const std::unique_ptr<WaveReads> first = Wave(0, 3);
  const std::unique_ptr<WaveReads> second = Wave(3, 3);
  // Rows 0 to 2 are neighbours in the file: one run, whose read fails.
  const ExtentFileOpener open = Opener(/*held_at=*/-1, /*failing_at=*/0);
  const ReadContext context{&open, &step_dir_, true};
  std::vector<ReadBuffer> buffers(1);
  ReaderCrew crew(context, buffers);
  const int w0 = crew.Add(*first);
  const int w1 = crew.Add(*second);
  const absl::Status failed = crew.Wait(w0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.message(), HasSubstr("array 'w': extent 0 of 6"));
  EXPECT_THAT(failed.message(), HasSubstr("disk gone"));
  // The next wave is not read once a run has failed, and waiting for it
  // returns the same error rather than waiting forever.
  EXPECT_EQ(crew.Wait(w1), failed);
  crew.Stop();
  EXPECT_EQ(crew.bytes_read(), 0);
}

TEST_F(ReaderCrewTest, AnXxh3MismatchNamesTheExtentFileAndOffset) {
  release_.Notify();
  array_.extents[4].hash = HashExtent("not these bytes", 15);
  const std::unique_ptr<WaveReads> wave = Wave(0, kRows);
  const ExtentFileOpener open = Opener(-1, -1);
  const ReadContext context{&open, &step_dir_, true};
  std::vector<ReadBuffer> buffers(3);
  ReaderCrew crew(context, buffers);
  const absl::Status status = crew.Wait(crew.Add(*wave));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("array 'w': extent 4 of 6: xxh3 mismatch "
                                     "in data/r00000_w00.bin @ ",
                                     4 * kBlock)));
}

}  // namespace
}  // namespace hoist
