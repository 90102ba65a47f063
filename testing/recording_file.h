// Test helper: a ReadableFile that records every read it passes on (where
// in the file, how many bytes, and into which memory). Thread-safe: a
// restore's readers share the files they open.
#ifndef HOIST_TESTING_RECORDING_FILE_H_
#define HOIST_TESTING_RECORDING_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "hoist/mutex.h"
#include "hoist/storage.h"

namespace hoist::testing {

struct RecordedRead {
  int64_t offset = 0;
  int64_t bytes = 0;
  const uint8_t* into = nullptr;
};

// What RecordingFiles record, shared by all of them.
class ReadLog {
 public:
  void Add(const RecordedRead& read) {
    MutexLock lock(&mu_);
    reads_.push_back(read);
  }
  std::vector<RecordedRead> reads() const {
    MutexLock lock(&mu_);
    return reads_;
  }
  // Blocks until `holds()` is true, asked now and again each time a read
  // is recorded (before the read is passed on). `holds` runs under the
  // log's lock: it must not call the log.
  void AwaitUntil(const std::function<bool()>& holds) {
    MutexLock lock(&mu_);
    mu_.Await(Condition(&Holds, &holds));
  }

 private:
  static bool Holds(const std::function<bool()>* holds) { return (*holds)(); }

  mutable Mutex mu_;
  std::vector<RecordedRead> reads_ ABSL_GUARDED_BY(mu_);
};

class RecordingFile final : public ReadableFile {
 public:
  RecordingFile(std::unique_ptr<ReadableFile> file, ReadLog& log)
      : file_(std::move(file)), log_(log) {}
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    log_.Add({offset, static_cast<int64_t>(out.size()), out.data()});
    return file_->ReadAt(offset, out);
  }
  absl::StatusOr<int64_t> Size() override { return file_->Size(); }

 private:
  std::unique_ptr<ReadableFile> file_;
  ReadLog& log_;
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_RECORDING_FILE_H_
