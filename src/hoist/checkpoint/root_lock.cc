#include "hoist/checkpoint/root_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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
#include "hoist/storage.h"

namespace hoist {

namespace {

constexpr char kLockFileName[] = ".hoist.lock";

// Opens the lock file without following a link or blocking on a FIFO, and
// checks that it is a regular file with one name, owned by this user: only
// then may it be truncated and written.
absl::StatusOr<int> OpenLockFile(const std::string& path, int flags) {
  const int fd =
      open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is a symbolic link; hoist never follows a link to lock a root "
          "(remove it)",
          path));
    }
    return ErrnoStatus(errno, "open lock file", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "fstat lock file", path);
  }
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 ||
      ((flags & O_RDWR) && st.st_uid != geteuid())) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s must be a regular file with one name, owned by the user that "
        "opens the root (uid %d); it is %s with %d names, owned by uid %d. "
        "Remove it if the root is yours",
        path, geteuid(), S_ISREG(st.st_mode) ? "a regular file" : "not",
        st.st_nlink, st.st_uid));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RootLock>> RootLock::Acquire(
    const std::string& root) {
  const std::string path = JoinPath(root, kLockFileName);
  absl::StatusOr<int> opened = OpenLockFile(path, O_RDWR | O_CREAT);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
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
  const std::string path = JoinPath(root, kLockFileName);
  const absl::StatusOr<int> opened = OpenLockFile(path, O_RDONLY);
  const int fd = opened.ok() ? *opened : -1;
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
