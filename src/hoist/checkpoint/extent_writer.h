// ExtentWriter: the persist stage. A StagedExtentSink that writes each staged
// extent into its data file at its planned offset, hashes it (XXH3-64) while
// it is hot in cache, and releases its lease as soon as the write returns, so
// the staging pool recycles during the save.
//
// It owns `threads_per_file` writer threads per data file of its process
// (the plan's writer streams), started by Open and joined by Finish or the
// destructor; the threads of one file take its extents in turn, so one
// hashes while another's write is in flight. A thread takes the queued
// extent lowest in the file together with the queued ones that continue it
// (up to 16 MiB), and writes them as one vectored write of whole 4 KiB
// blocks, each extent padded with zeros to the next one's aligned offset.
// OnStaged only queues, so device copy threads never wait on storage.
//
// A file written from start to end (WritableFile::sequential(): an object)
// gets one thread, which appends what is queued in the order of the plan's
// offsets, each extent where the file ends (still 4 KiB-aligned, since
// every extent is padded to whole blocks): a wave staged out of the plan's
// order never waits for the extents of a later wave. Finish reports where
// each extent landed.
#ifndef HOIST_CHECKPOINT_EXTENT_WRITER_H_
#define HOIST_CHECKPOINT_EXTENT_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "hoist/checkpoint_types.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/storage.h"
#include "hoist/trace.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

// What the writers did with each slice of a plan: its XXH3-64 and the
// offset in its data file where it landed (the planned one unless its file
// is sequential).
struct WrittenExtents {
  WrittenExtents() = default;
  // Hashes 0, offsets as planned.
  explicit WrittenExtents(const SavePlan& plan);
  std::vector<uint64_t> hashes;
  std::vector<int64_t> offsets;
};

class ExtentWriter final : public StagedExtentSink {
 public:
  // Creates (truncating) the data files of `process` under `dir` (their plan
  // paths are relative to it; `dir`/data must exist) and starts
  // `threads_per_file` (>= 1) writer threads per file, each of which runs
  // `thread_setup` first when set. `storage` and `plan` must outlive the
  // writer.
  static absl::StatusOr<std::unique_ptr<ExtentWriter>> Open(
      Storage& storage, const std::string& dir, const SavePlan& plan,
      int process, int threads_per_file = 2, Tracer* tracer = nullptr,
      SaveProgress* progress = nullptr,
      std::function<void()> thread_setup = nullptr);

  ~ExtentWriter() override;

  // Queues the extent for its file's writer. After a failure, extents are
  // dropped (their leases released) without being written.
  void OnStaged(StagedExtent extent) override;

  // Waits until every queued extent is written, syncs and closes every file,
  // and returns each plan slice's hash and offset (for slices of other
  // processes: 0 and the planned offset), or the first error of any write,
  // sync or close. Call once, after the last OnStaged.
  absl::StatusOr<WrittenExtents> Finish();

 private:
  struct Stream {
    ExtentWriter* owner = nullptr;
    std::unique_ptr<WritableFile> file;
    std::string path;
    std::map<int64_t, StagedExtent> queue;  // by file offset; guarded by mu_
    std::vector<std::thread> threads;
    // Where the next append goes, for a sequential file (its one thread's).
    int64_t end = 0;
  };

  ExtentWriter(const SavePlan& plan, Tracer* tracer, SaveProgress* progress)
      : plan_(plan), tracer_(tracer), progress_(progress) {}
  void Run(Stream* stream);
  static bool StreamHasWork(Stream* stream) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void StopThreads() ABSL_LOCKS_EXCLUDED(mu_);

  const SavePlan& plan_;
  Tracer* const tracer_;          // "writer FILE" tracks, when set
  SaveProgress* const progress_;  // bytes staged and written, when set
  std::vector<std::unique_ptr<Stream>> streams_;  // by file index - first
  int first_file_ = 0;
  mutable Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  WrittenExtents written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_EXTENT_WRITER_H_
