#include "hoist/checkpoint/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/io/errno_status.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<RootLock>> RootLock::Acquire(
    const std::string& root) {
  const std::string path = root + "/.hoist.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "open lock file", path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {0};
    const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is in use by another CheckpointManager (lock %s held by pid "
          "%s); two managers must never write one root",
          root, path, n > 0 ? std::string(holder, n) : "unknown"));
    }
    return ErrnoStatus(err, "flock", path);
  }
  const std::string pid = std::to_string(getpid());
  if (ftruncate(fd, 0) == 0) {
    (void)!pwrite(fd, pid.data(), pid.size(), 0);
  }
  return std::unique_ptr<RootLock>(new RootLock(fd));
}

RootLock::~RootLock() {
  flock(fd_, LOCK_UN);
  close(fd_);
}

}  // namespace hoist
