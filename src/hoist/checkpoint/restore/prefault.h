// Faulting in a restore's fresh destination memory ahead of its reads.
//
// A restore into new host memory (a job's NumPy arrays, HostArrays) pays
// for every destination page the first time it is written. Faulted inside
// the O_DIRECT reads (the kernel pins the pages it reads into), 2 GiB of
// new memory cost 1.8-2.5 s of system time on this project's 2-core VM;
// faulted by madvise(MADV_POPULATE_WRITE), about 1 s: the same pages,
// without a trap and a pin per page. A Prefaulter populates the ranges of the
// runs the readers will take next, on threads of its own, while the readers
// wait on the disk, and skips the runs a reader has already taken (its read
// faults them in as before). Memory already resident costs only a page-table
// walk.
#ifndef HOIST_CHECKPOINT_RESTORE_PREFAULT_H_
#define HOIST_CHECKPOINT_RESTORE_PREFAULT_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace hoist {

// Bytes a restore writes in place, as part of run `run` (runs are taken by
// the readers in increasing order).
struct PrefaultRange {
  size_t run;
  uint8_t* data;
  int64_t bytes;
};

class Prefaulter {
 public:
  // Starts `threads` threads populating `ranges` (ordered by run) in pieces
  // of at most 8 MiB, each piece skipped once `taken` (the number of runs
  // the readers have started) passes its run. With no ranges or no
  // threads, starts nothing. Stops at the first range the kernel refuses
  // (a kernel before 5.14 has no MADV_POPULATE_WRITE; memory that is not
  // writable): the reads fault what is left, as without a Prefaulter.
  Prefaulter(std::vector<PrefaultRange> ranges,
             const std::atomic<size_t>& taken, int threads);
  // Stops the threads (between pieces) and joins them.
  ~Prefaulter();
  // Waits until the threads have gone through every piece (tests).
  void Join();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Bytes populated so far (tests).
  int64_t populated_bytes() const { return populated_.load(); }

 private:
  void Run();

  struct Piece {
    size_t run;
    uint8_t* data;  // page-aligned
    int64_t bytes;  // whole pages
  };
  std::vector<Piece> pieces_;
  const std::atomic<size_t>& taken_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> populated_{0};
  std::vector<std::thread> threads_;
};

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_PREFAULT_H_
