#include "hoist/io/file_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

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
// A ring per thread: writer and reader threads submit without sharing a lock.
class ThreadRing {
 public:
  ThreadRing() { init_ = io_uring_queue_init(8, &ring_, 0); }
  ~ThreadRing() {
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

ThreadRing& Ring() {
  thread_local ThreadRing ring;
  return ring;
}

class IoUringFileIo final : public FileIo {
 public:
  ssize_t Writev(int fd, const iovec* iov, int count, int64_t offset) override {
    return Ring().Run([&](io_uring_sqe* sqe) {
      io_uring_prep_writev(sqe, fd, iov, count, offset);
    });
  }
  ssize_t Readv(int fd, const iovec* iov, int count, int64_t offset) override {
    return Ring().Run([&](io_uring_sqe* sqe) {
      io_uring_prep_readv(sqe, fd, iov, count, offset);
    });
  }
  int Fsync(int fd) override {
    return Ring().Run(
        [&](io_uring_sqe* sqe) { io_uring_prep_fsync(sqe, fd, 0); });
  }
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
