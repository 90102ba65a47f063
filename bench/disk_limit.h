// The disk's own limit, measured as fio measures it: several jobs, each
// with a file of its own (or a part of one file) and a deep queue of O_DIRECT
// requests through its own io_uring, i.e. what
//   fio --ioengine=io_uring --direct=1 --numjobs=J --iodepth=D --bs=B
//       --size=BYTES/J --rw=write (then --rw=read) --end_fsync=1
// reports for the same bytes on the same filesystem, its buffers in huge
// pages (--mem=mmap with transparent huge pages on; see huge_pages). "hoist at
// x of raw" then means x of the disk, not of a weak one-thread baseline.
#ifndef HOIST_BENCH_DISK_LIMIT_H_
#define HOIST_BENCH_DISK_LIMIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hoist::bench {

struct DiskLimitOptions {
  int jobs = 4;                            // threads, each with its own file
  int depth = 16;                          // requests in flight per job
  int64_t block_bytes = int64_t{1} << 20;  // bytes per request
  // Every job writes (then reads) its own part of one shared file, as a
  // single output file (a safetensors export) is written.
  bool one_file = false;
  // The jobs' buffers in huge pages (MADV_HUGEPAGE), as hoist's staging pool
  // and its read and export buffers are. On this benchmark's VM (a
  // Firecracker guest, virtio-blk) O_DIRECT I/O from huge pages ran 1.3-1.7x
  // faster than from 4 KiB pages (fio --mem=mmap with transparent huge pages
  // on against off), so the limit is measured with them; false measures
  // what fio's default (malloc'd 4 KiB pages) gets.
  bool huge_pages = true;
};

struct DiskLimit {
  double write_s = 0;  // from the first request to the last file's fsync
  double read_s = 0;   // the same files read back
  int64_t bytes = 0;   // written, then read (a whole number of blocks)
};

// Writes then reads `bytes` under `dir` as DiskLimitOptions says, and
// removes its files. Errors: those of open, io_uring and short transfers,
// naming the job and offset; kUnimplemented when built without liburing.
absl::StatusOr<DiskLimit> MeasureDiskLimit(const std::string& dir,
                                           int64_t bytes,
                                           const DiskLimitOptions& options);

// Reads the files at `paths` (existing ones, such as a saved step's data
// files) as DiskLimitOptions says: the jobs split the files' whole blocks
// among them, each job a contiguous range of one file (a file shorter than
// a block is left out), at least one job per file. The disk's read limit
// for those very bytes, where they lie, as old as they are (beside
// MeasureDiskLimit's, which reads files it has just written).
absl::StatusOr<DiskLimit> MeasureReadLimit(
    const std::vector<std::string>& paths, const DiskLimitOptions& options);

}  // namespace hoist::bench

#endif  // HOIST_BENCH_DISK_LIMIT_H_
