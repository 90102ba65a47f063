#include "hoist/checkpoint/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/io/errno_status.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<RootLock>> RootLock::Acquire(
    const std::string& root) {
  const std::string path = root + "/.hoist.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open lock file", path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[256] = {0};
    const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is in use by another CheckpointManager (lock %s held by %s); "
          "two managers must never write one root",
          root, path, n > 0 ? std::string(holder, n) : "unknown"));
    }
    return ErrnoStatus(err, "flock", path);
  }
  char host[128] = {0};
  gethostname(host, sizeof host - 1);
  const std::string token = absl::StrFormat(
      "pid %d on %s, %016x", getpid(), host,
      std::random_device{}() * uint64_t{0x9e3779b97f4a7c15} ^
          static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  if (ftruncate(fd, 0) != 0 || pwrite(fd, token.data(), token.size(), 0) !=
                                   static_cast<ssize_t>(token.size())) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "write lock file", path);
  }
  return std::unique_ptr<RootLock>(new RootLock(fd, token));
}

absl::Status RootLock::Check(const std::string& root,
                             const std::string& token) {
  const std::string path = root + "/.hoist.lock";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::string held(256, '\0');
  const ssize_t n = fd < 0 ? -1 : pread(fd, held.data(), held.size(), 0);
  if (fd >= 0) close(fd);
  held.resize(std::max<ssize_t>(n, 0));
  if (held != token) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s does not hold rank 0's lock ('%s' instead of '%s'): every "
        "process of the job must see the same checkpoint root (a shared "
        "filesystem)",
        path, held, token));
  }
  return absl::OkStatus();
}

RootLock::~RootLock() {
  flock(fd_, LOCK_UN);
  close(fd_);
}

}  // namespace hoist
