#include "bench/disk_limit.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"

#if HOIST_BENCH_HAVE_URING
#include <liburing.h>
#endif

namespace hoist::bench {

#if HOIST_BENCH_HAVE_URING
namespace {

// One job: `blocks` requests of `block` bytes over its file from `base`,
// `depth` in flight at a time, then (writes) fsync.
absl::Status RunJob(const std::string& path, bool write, int64_t base,
                    int64_t blocks, const DiskLimitOptions& options) {
  const int flags =
      write ? (O_WRONLY | O_CREAT | O_DIRECT) : (O_RDONLY | O_DIRECT);
  const int fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrFormat("open %s with O_DIRECT: %s",
                                               path, std::strerror(errno)));
  }
  io_uring ring;
  if (const int rc = io_uring_queue_init(options.depth, &ring, 0); rc < 0) {
    close(fd);
    return absl::InternalError(
        absl::StrFormat("io_uring_queue_init: %s", std::strerror(-rc)));
  }
  const int64_t block = options.block_bytes;
  // Whole 2 MiB pages, asked for as huge pages (DiskLimitOptions::huge_pages).
  const int64_t buffer_bytes = AlignUp(block * options.depth, int64_t{2} << 20);
  void* mapped = mmap(nullptr, buffer_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    io_uring_queue_exit(&ring);
    close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "mmap of %d bytes: %s", buffer_bytes, std::strerror(errno)));
  }
  if (options.huge_pages) madvise(mapped, buffer_bytes, MADV_HUGEPAGE);
  auto* buffers = static_cast<uint8_t*>(mapped);
  // Random bytes, as fio writes by default (a disk that compresses or
  // deduplicates would make constant bytes look faster than data).
  uint64_t state = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(fd);
  for (int64_t i = 0; i < block * options.depth; i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(buffers + i, &state, 8);
  }
  absl::Status status;
  int64_t submitted = 0, completed = 0;
  std::vector<int> free_slots;
  for (int i = options.depth - 1; i >= 0; --i) free_slots.push_back(i);
  while (completed < blocks && status.ok()) {
    while (submitted < blocks && !free_slots.empty()) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      uint8_t* data = buffers + slot * block;
      if (write) {
        io_uring_prep_write(sqe, fd, data, block, base + submitted * block);
      } else {
        io_uring_prep_read(sqe, fd, data, block, base + submitted * block);
      }
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
      ++submitted;
    }
    io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (const int rc = io_uring_wait_cqe(&ring, &cqe); rc < 0) {
      status = absl::InternalError(
          absl::StrFormat("io_uring_wait_cqe: %s", std::strerror(-rc)));
      break;
    }
    if (cqe->res != block) {
      status = absl::InternalError(absl::StrFormat(
          "%s of %s: %d of %d bytes (%s)", write ? "write" : "read", path,
          cqe->res, block, cqe->res < 0 ? std::strerror(-cqe->res) : "short"));
    }
    free_slots.push_back(static_cast<int>(io_uring_cqe_get_data64(cqe)));
    io_uring_cqe_seen(&ring, cqe);
    ++completed;
  }
  // Drain what is still in flight after an error before the buffers go.
  while (completed < submitted) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
    io_uring_cqe_seen(&ring, cqe);
    ++completed;
  }
  if (status.ok() && write && fsync(fd) != 0) {
    status = absl::InternalError(
        absl::StrFormat("fsync %s: %s", path, std::strerror(errno)));
  }
  io_uring_queue_exit(&ring);
  munmap(mapped, buffer_bytes);
  close(fd);
  return status;
}

// One job's part of the I/O: `blocks` blocks of `path` from `base`.
struct Range {
  std::string path;
  int64_t base;
  int64_t blocks;
};

// Runs a job per range, all at once; the wall time from their start to the
// last end.
absl::StatusOr<double> RunJobs(const std::vector<Range>& ranges, bool write,
                               const DiskLimitOptions& options) {
  std::vector<absl::Status> statuses(ranges.size());
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (size_t j = 0; j < ranges.size(); ++j) {
    threads.emplace_back([&, j] {
      statuses[j] = RunJob(ranges[j].path, write, ranges[j].base,
                           ranges[j].blocks, options);
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return seconds;
}

absl::Status CheckOptions(const DiskLimitOptions& options) {
  if (options.jobs < 1 || options.depth < 1 || options.block_bytes < 4096 ||
      options.block_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(
        "disk limit: jobs and depth must be >= 1, the block a multiple of "
        "4 KiB");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DiskLimit> MeasureDiskLimit(const std::string& dir,
                                           int64_t bytes,
                                           const DiskLimitOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  const int64_t per_job = options.block_bytes * options.jobs;
  const int64_t blocks_per_job =
      std::max<int64_t>(1, (bytes + per_job - 1) / per_job);
  // A file per job, or with one file, job j writing its j-th part.
  std::vector<Range> ranges;
  for (int j = 0; j < options.jobs; ++j) {
    ranges.push_back(
        {absl::StrFormat("%s/disk_limit.%d.%d", dir, getpid(),
                         options.one_file ? 0 : j),
         options.one_file ? j * blocks_per_job * options.block_bytes : 0,
         blocks_per_job});
  }
  // New files (jobs open them without truncating: one file is shared).
  for (const Range& range : ranges) unlink(range.path.c_str());
  DiskLimit limit;
  limit.bytes = blocks_per_job * per_job;
  absl::StatusOr<double> written = RunJobs(ranges, /*write=*/true, options);
  absl::StatusOr<double> read =
      written.ok() ? RunJobs(ranges, /*write=*/false, options) : written;
  for (const Range& range : ranges) unlink(range.path.c_str());
  if (!read.ok()) return read.status();
  limit.write_s = *written;
  limit.read_s = *read;
  return limit;
}

absl::StatusOr<DiskLimit> MeasureReadLimit(
    const std::vector<std::string>& paths, const DiskLimitOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  // Each file's whole blocks, cut into ranges so that every job has one.
  const int files = static_cast<int>(std::max<size_t>(paths.size(), 1));
  const int per_file = std::max(1, (options.jobs + files - 1) / files);
  std::vector<Range> ranges;
  DiskLimit limit;
  for (const std::string& path : paths) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrFormat("stat %s: %s", path, std::strerror(errno)));
    }
    const int64_t blocks = st.st_size / options.block_bytes;
    for (int p = 0; p < per_file; ++p) {
      const int64_t first = blocks * p / per_file;
      const int64_t last = blocks * (p + 1) / per_file;
      if (last > first) {
        ranges.push_back({path, first * options.block_bytes, last - first});
        limit.bytes += (last - first) * options.block_bytes;
      }
    }
  }
  ASSIGN_OR_RETURN(limit.read_s, RunJobs(ranges, /*write=*/false, options));
  return limit;
}

#else  // !HOIST_BENCH_HAVE_URING

absl::StatusOr<DiskLimit> MeasureDiskLimit(const std::string&, int64_t,
                                           const DiskLimitOptions&) {
  return absl::UnimplementedError(
      "the disk limit needs io_uring: build with liburing");
}

absl::StatusOr<DiskLimit> MeasureReadLimit(const std::vector<std::string>&,
                                           const DiskLimitOptions&) {
  return absl::UnimplementedError(
      "the read limit needs io_uring: build with liburing");
}

#endif

}  // namespace hoist::bench
