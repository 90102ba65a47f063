// Reading a restore's waves (restore.cc): which requests each wave's
// extents are read in (its runs), and the crew of reader threads that reads
// them, one wave after the other without stopping in between.
#ifndef HOIST_CHECKPOINT_RESTORE_WAVE_READER_H_
#define HOIST_CHECKPOINT_RESTORE_WAVE_READER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "hoist/box.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/checkpoint/restore/prefault.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/manifest.h"
#include "hoist/mutex.h"

namespace hoist {

// One saved extent a wave reads, and the wave's images it feeds.
struct ReadTask {
  const ManifestArray* array;
  int extent;
  std::vector<int> images;  // indices into the wave's images
};

// Where one image's intersections go during a wave.
struct WaveImage {
  Box box;
  uint8_t* host;  // the host destination itself, or the image's lease
  bool in_place;  // the destination itself: memory perhaps never touched
};

// What every read of a restore shares.
struct ReadContext {
  const ExtentFileOpener* open;
  const std::string* step_dir;
  bool verify;  // check each extent's XXH3 (RestoreOptions::verify_xxh3)
  // Adds the nanoseconds the reader threads spent checking hashes, when
  // set (the restore's verify phase).
  std::atomic<int64_t>* verify_ns = nullptr;
  // Adds the bytes read, when set (RestoreOptions::progress).
  OperationProgress* progress = nullptr;
};

// A reader thread's open data files, by path.
using OpenFiles =
    absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>>;

// One wave's reads, planned into runs: each run is one read request (or,
// for a scattered extent larger than a run, one extent read in pieces).
// Immutable once made; ReadRun may be called from several threads at once,
// for different runs.
class WaveReads {
 public:
  // Plans reading `tasks` into `images` (the rules are at the top of the
  // .cc). `stage_in_place` reads host destinations through the readers'
  // buffers (RestoreOptions::stage_host_reads).
  WaveReads(std::vector<ReadTask> tasks, std::vector<WaveImage> images,
            bool stage_in_place);

  size_t runs() const { return runs_.size(); }
  size_t tasks() const { return tasks_.size(); }
  const std::vector<WaveImage>& images() const { return images_; }

  // The in-place bytes each run writes, by run (for a Prefaulter).
  std::vector<PrefaultRange> FreshRanges() const;

  // Reads run `r` with `buffer`, opening files into `files`, verifies each
  // of its extents and scatters them into their images; adds the bytes
  // read to `bytes_read`. Errors name the array and extent: those of
  // opening and reading the file, and kDataLoss for an xxh3 mismatch.
  absl::Status ReadRun(size_t r, const ReadContext& context, ReadBuffer& buffer,
                       OpenFiles& files,
                       std::atomic<int64_t>& bytes_read) const;

 private:
  const ManifestExtent& extent_of(int task) const {
    return tasks_[task].array->extents[tasks_[task].extent];
  }

  std::vector<ReadTask> tasks_;
  std::vector<WaveImage> images_;
  // Per task: where in its only image it is read straight to, if it is.
  std::vector<std::optional<int64_t>> direct_at_;
  std::vector<int> order_;                       // tasks by file and offset
  std::vector<std::pair<size_t, size_t>> runs_;  // [begin, end) of order_
};

// Reader threads shared by the waves of one restore. Each wave's runs are
// queued when it is added, and the readers take them in order, across
// waves: a reader done with one wave goes on with the next one's runs while
// the last reads of the first are still under way, instead of every reader
// waiting for them. Starts a thread per ReadBuffer at most (and no more
// than there are runs), each reading with its own buffer; joins them when
// destroyed. Thread-safe.
class ReaderCrew {
 public:
  // `context` and `buffers` must outlive the crew.
  ReaderCrew(const ReadContext& context, std::vector<ReadBuffer>& buffers);
  ~ReaderCrew();
  ReaderCrew(const ReaderCrew&) = delete;
  ReaderCrew& operator=(const ReaderCrew&) = delete;

  // Queues every run of `wave` (which must outlive the crew, or a Stop())
  // and returns the wave's number, for Wait and taken.
  int Add(const WaveReads& wave) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every run of wave `wave` has been read, or a run of any
  // wave has failed (then its error, also for a later call).
  absl::Status Wait(int wave) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs of wave `wave` the readers have started, in queue order (for a
  // Prefaulter). Valid while the crew lives.
  const std::atomic<size_t>& taken(int wave) const ABSL_LOCKS_EXCLUDED(mu_);

  // Drops every queued run, and blocks until no reader is reading: no
  // buffer or image is written after it returns.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t bytes_read() const { return bytes_read_.load(); }

 private:
  struct Wave {
    const ReaderCrew* crew;
    const WaveReads* reads;
    std::atomic<size_t> taken{0};
    size_t done = 0;  // runs read (or dropped), under crew->mu_
  };

  // A reader: takes queued runs until the crew closes.
  void Read(ReadBuffer& buffer) ABSL_LOCKS_EXCLUDED(mu_);
  // Conditions for Await (evaluated with mu_ held).
  static bool WaveOverOrFailed(const Wave* wave) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  bool HasRunOrClosing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NoneReading() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the queued runs (counted done: their waves are over).
  void DropQueue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ReadContext context_;
  std::vector<ReadBuffer>& buffers_;
  std::atomic<int64_t> bytes_read_{0};
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Wave>> waves_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<Wave*, size_t>> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_runs_ ABSL_GUARDED_BY(mu_) = 0;  // ever queued
  int reading_ ABSL_GUARDED_BY(mu_) = 0;         // readers inside ReadRun
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_WAVE_READER_H_
