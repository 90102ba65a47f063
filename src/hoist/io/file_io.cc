#include "hoist/io/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/mutex.h"

#ifdef HOIST_HAVE_LIBURING
#include <liburing.h>
#endif

namespace hoist {
namespace {

class SyscallFileIo final : public FileIo {
 public:
  ssize_t Writev(int fd, const iovec* iov, int count, int64_t offset) override {
    const ssize_t n = pwritev(fd, iov, count, offset);
    return n < 0 ? -errno : n;
  }
  ssize_t Readv(int fd, const iovec* iov, int count, int64_t offset) override {
    const ssize_t n = preadv(fd, iov, count, offset);
    return n < 0 ? -errno : n;
  }
  int Fsync(int fd) override { return fsync(fd) == 0 ? 0 : -errno; }
};

#ifdef HOIST_HAVE_LIBURING
// A ring, used by one thread at a time.
class Ring {
 public:
  Ring() { init_ = io_uring_queue_init(8, &ring_, 0); }
  ~Ring() {
    if (init_ == 0) io_uring_queue_exit(&ring_);
  }
  // Submits one prepared operation and waits for its result.
  template <typename Prep>
  int Run(Prep prep) {
    if (init_ != 0) return init_;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return -EBUSY;
    prep(sqe);
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return rc;
    io_uring_cqe* cqe = nullptr;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return rc;
    const int result = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    return result;
  }

 private:
  io_uring ring_;
  int init_;
};

// Rings are kept for the life of the engine and lent to one caller at a
// time, so threads never set up a ring of their own (restore starts reader
// threads per wave) and a ring's memory is never unmapped under another.
class RingPool {
 public:
  std::unique_ptr<Ring> Take() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        std::unique_ptr<Ring> ring = std::move(free_.back());
        free_.pop_back();
        return ring;
      }
    }
    return std::make_unique<Ring>();
  }
  void Give(std::unique_ptr<Ring> ring) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    free_.push_back(std::move(ring));
  }

 private:
  Mutex mu_;
  std::vector<std::unique_ptr<Ring>> free_ ABSL_GUARDED_BY(mu_);
};

class IoUringFileIo final : public FileIo {
 public:
  ssize_t Writev(int fd, const iovec* iov, int count, int64_t offset) override {
    return Run([&](io_uring_sqe* sqe) {
      io_uring_prep_writev(sqe, fd, iov, count, offset);
    });
  }
  ssize_t Readv(int fd, const iovec* iov, int count, int64_t offset) override {
    return Run([&](io_uring_sqe* sqe) {
      io_uring_prep_readv(sqe, fd, iov, count, offset);
    });
  }
  int Fsync(int fd) override {
    return Run([&](io_uring_sqe* sqe) { io_uring_prep_fsync(sqe, fd, 0); });
  }

 private:
  template <typename Prep>
  int Run(Prep prep) {
    std::unique_ptr<Ring> ring = rings_.Take();
    const int result = ring->Run(prep);
    rings_.Give(std::move(ring));
    return result;
  }

  RingPool rings_;
};
#endif

}  // namespace

std::unique_ptr<FileIo> MakeSyscallFileIo() {
  return std::make_unique<SyscallFileIo>();
}

absl::StatusOr<std::unique_ptr<FileIo>> MakeIoUringFileIo() {
#ifdef HOIST_HAVE_LIBURING
  io_uring probe;
  const int rc = io_uring_queue_init(2, &probe, 0);
  if (rc < 0) {
    return absl::UnavailableError(absl::StrFormat(
        "io_uring unavailable: io_uring_queue_init: %s", std::strerror(-rc)));
  }
  io_uring_queue_exit(&probe);
  return std::make_unique<IoUringFileIo>();
#else
  return absl::UnavailableError(
      "io_uring unavailable: hoist was built without liburing");
#endif
}

}  // namespace hoist
