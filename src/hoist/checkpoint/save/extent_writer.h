// ExtentWriter: the persist stage. A StagedExtentSink that hashes each
// staged extent (XXH3-128) while it is hot in cache, writes it into its data
// file at its planned offset, and releases its lease as soon as the write
// returns, so the staging pool recycles during the save. An extent whose
// hash equals its DeltaBase extent's is not written at all (its place in a
// file that is written at planned offsets stays a hole): the manifest
// references the base's bytes.
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
#ifndef HOIST_CHECKPOINT_SAVE_EXTENT_WRITER_H_
#define HOIST_CHECKPOINT_SAVE_EXTENT_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "hoist/checkpoint/save/delta.h"
#include "hoist/checkpoint_types.h"
#include "hoist/mutex.h"
#include "hoist/save_plan.h"
#include "hoist/storage.h"
#include "hoist/trace.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

// What the writers did with each slice of a plan: its XXH3-128, the offset
// in its data file where it landed (the planned one unless its file is
// sequential), and whether it was referenced (its DeltaBase extent's bytes
// are the same) instead of written.
struct WrittenExtents {
  WrittenExtents() = default;
  // Hashes 0, offsets as planned, nothing referenced.
  explicit WrittenExtents(const SavePlan& plan);
  std::vector<ExtentHash> hashes;
  std::vector<int64_t> offsets;
  std::vector<uint8_t> referenced;  // 1: the base's bytes, not written
};

class ExtentWriter final : public StagedExtentSink {
 public:
  // Creates (truncating) the data files of `process` under `dir` (their plan
  // paths are relative to it; `dir`/data must exist) and starts
  // `threads_per_file` (>= 1) writer threads per file, each of which runs
  // `thread_setup` first when set. `storage`, `plan` and `base` must
  // outlive the writer; without `base`, every extent is written.
  static absl::StatusOr<std::unique_ptr<ExtentWriter>> Open(
      Storage& storage, const std::string& dir, const SavePlan& plan,
      int process, int threads_per_file = 2, Tracer* tracer = nullptr,
      SaveProgress* progress = nullptr,
      std::function<void()> thread_setup = nullptr,
      const DeltaBase* base = nullptr);

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

  ExtentWriter(const SavePlan& plan, Tracer* tracer, SaveProgress* progress,
               const DeltaBase* base)
      : plan_(plan), tracer_(tracer), progress_(progress), base_(base) {}
  void Run(Stream* stream);
  // kFailedPrecondition when `slice` is a frozen array's whose bytes
  // (`hash`) differ from its base extent's.
  absl::Status FrozenChanged(int slice, const ExtentHash& hash) const;
  // "writer data/r00000_w00.bin": the trace track of an extent's file.
  std::string TrackOf(const StagedExtent& extent) const;
  static bool StreamHasWork(Stream* stream) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void StopThreads() ABSL_LOCKS_EXCLUDED(mu_);

  const SavePlan& plan_;
  Tracer* const tracer_;  // "writer FILE" tracks, when set
  // Counts bytes written, when set (the save's DeferredSink counts those
  // staged).
  SaveProgress* const progress_;
  const DeltaBase* const base_;  // what may be referenced; null: nothing
  std::vector<std::unique_ptr<Stream>> streams_;  // by file index - first
  int first_file_ = 0;
  mutable Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  WrittenExtents written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_SAVE_EXTENT_WRITER_H_
