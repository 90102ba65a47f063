// POSIX storage, over a FileIo engine (syscalls or io_uring). Files keep two
// descriptors: a buffered one, and one opened with O_DIRECT where the
// filesystem allows it (tmpfs refuses; then every transfer is buffered). A
// transfer whose offset, buffers and lengths are 4 KiB-aligned goes through
// O_DIRECT, skipping the page cache; an unaligned tail goes buffered. If the
// O_DIRECT descriptor refuses a transfer with EINVAL, the file falls back to
// buffered I/O for good. Sync() is fsync on the buffered descriptor, which
// also makes the O_DIRECT writes' metadata durable.
//
// A checkpoint root is input: every file is opened with O_NOFOLLOW and
// O_NONBLOCK and must be a regular file (a FIFO never blocks a reader), files
// are created with O_EXCL, reads below a step directory walk down with
// openat(O_NOFOLLOW), and trees are removed through directory descriptors,
// so hoist never reads, writes or deletes through a link.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/io/errno_status.h"
#include "hoist/io/file_io.h"
#include "hoist/storage.h"

namespace hoist {
namespace {

constexpr int64_t kDirectAlignment = 4096;

bool Aligned(int64_t value) { return value % kDirectAlignment == 0; }

// Moves every byte of `iov` (consumed) at `offset` through `io`, resuming
// after short transfers. A read that reaches the end of the file first is
// kDataLoss (truncated); EINVAL on the O_DIRECT descriptor is returned as a
// bare kInvalidArgument so the caller can fall back to buffered I/O.
absl::Status Transfer(FileIo& io, bool write, int fd, bool direct,
                      int64_t offset, std::vector<iovec> iov,
                      const std::string& path) {
  size_t first = 0;
  const int64_t start = offset;
  while (first < iov.size()) {
    const int count =
        static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t n = write ? io.Writev(fd, &iov[first], count, offset)
                            : io.Readv(fd, &iov[first], count, offset);
    if (n == -EINTR || n == -EAGAIN) continue;
    if (n < 0) {
      if (n == -EINVAL && direct) {
        return absl::InvalidArgumentError("O_DIRECT refused");
      }
      return ErrnoStatus(
          static_cast<int>(-n),
          absl::StrFormat("%s at offset %d", write ? "write" : "read", offset),
          path);
    }
    if (n == 0 && !write) {
      return absl::DataLossError(absl::StrFormat(
          "%s: truncated: needed bytes at offset %d, the file ends at %d "
          "(read started at %d)",
          path, offset, offset, start));
    }
    offset += n;
    size_t done = static_cast<size_t>(n);
    while (first < iov.size() && done >= iov[first].iov_len) {
      done -= iov[first].iov_len;
      ++first;
    }
    if (done > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + done;
      iov[first].iov_len -= done;
    }
  }
  return absl::OkStatus();
}

// A file open for writing or reading, with a buffered descriptor and, where
// the filesystem allows, an O_DIRECT one. A transfer whose offset and
// pieces are all 4 KiB-aligned goes O_DIRECT; a single aligned piece with an
// unaligned tail goes O_DIRECT for its aligned body and buffered for the
// tail; anything else is buffered. An O_DIRECT descriptor that refuses a
// transfer (EINVAL) is not used again.
class PosixFile {
 public:
  PosixFile(FileIo& io, std::string path, int fd, int direct_fd)
      : io_(io), path_(std::move(path)), fd_(fd), direct_fd_(direct_fd) {}
  ~PosixFile() { Close().IgnoreError(); }

  absl::Status Move(bool write, int64_t offset,
                    absl::Span<const absl::Span<uint8_t>> pieces) {
    if (fd_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: file is closed", path_));
    }
    if (offset < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative offset %d", path_, offset));
    }
    std::vector<iovec> iov;
    iov.reserve(pieces.size());
    bool aligned = Aligned(offset);
    for (absl::Span<uint8_t> piece : pieces) {
      aligned &= Aligned(reinterpret_cast<uintptr_t>(piece.data()));
      iov.push_back({piece.data(), piece.size()});
    }
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      aligned &= Aligned(static_cast<int64_t>(pieces[i].size()));
    }
    // The last piece may end unaligned: its aligned body goes direct.
    iovec tail{nullptr, 0};
    if (aligned && !iov.empty()) {
      const size_t last = iov.back().iov_len;
      tail = {static_cast<uint8_t*>(iov.back().iov_base) +
                  last / kDirectAlignment * kDirectAlignment,
              last % kDirectAlignment};
      iov.back().iov_len -= tail.iov_len;
      if (iov.back().iov_len == 0) iov.pop_back();
    }
    if (aligned && !iov.empty() && direct_fd_ >= 0 &&
        direct_ok_.load(std::memory_order_relaxed)) {
      int64_t body = 0;
      for (const iovec& v : iov) body += static_cast<int64_t>(v.iov_len);
      absl::Status status =
          Transfer(io_, write, direct_fd_, true, offset, iov, path_);
      if (status.ok()) {
        if (tail.iov_len == 0) return status;
        return Transfer(io_, write, fd_, false, offset + body, {tail}, path_);
      }
      if (!absl::IsInvalidArgument(status)) return status;
      direct_ok_.store(false, std::memory_order_relaxed);  // fall back
    }
    if (tail.iov_len > 0) iov.push_back(tail);
    return Transfer(io_, write, fd_, false, offset, std::move(iov), path_);
  }

  absl::Status Sync() {
    if (fd_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: file is closed", path_));
    }
    if (const int rc = io_.Fsync(fd_); rc != 0) {
      return ErrnoStatus(-rc, "fsync", path_);
    }
    return absl::OkStatus();
  }

  absl::Status Reserve(int64_t offset, int64_t bytes) {
    if (fd_ < 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: file is closed", path_));
    }
    if (bytes <= 0) return absl::OkStatus();
    int rc;
    do {
      rc = fallocate(fd_, 0, offset, bytes);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS) {
      return absl::OkStatus();
    }
    return ErrnoStatus(
        errno, absl::StrFormat("fallocate of %d bytes at %d", bytes, offset),
        path_);
  }

  absl::StatusOr<int64_t> Size() {
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoStatus(errno, "fstat", path_);
    return static_cast<int64_t>(st.st_size);
  }

  absl::Status Close() {
    absl::Status status;
    if (direct_fd_ >= 0 && close(direct_fd_) != 0) {
      status = ErrnoStatus(errno, "close", path_);
    }
    if (fd_ >= 0 && close(fd_) != 0 && status.ok()) {
      status = ErrnoStatus(errno, "close", path_);
    }
    fd_ = direct_fd_ = -1;
    return status;
  }

 private:
  FileIo& io_;
  const std::string path_;
  int fd_;
  int direct_fd_;
  std::atomic<bool> direct_ok_{true};
};

absl::Span<uint8_t> Mutable(absl::Span<const uint8_t> data) {
  return {const_cast<uint8_t*>(data.data()), data.size()};
}

class PosixWritableFile final : public WritableFile {
 public:
  explicit PosixWritableFile(std::unique_ptr<PosixFile> file)
      : file_(std::move(file)) {}

  absl::Status WriteAt(int64_t offset,
                       absl::Span<const uint8_t> data) override {
    const absl::Span<uint8_t> piece = Mutable(data);
    return file_->Move(true, offset, {&piece, 1});
  }
  absl::Status WriteAtv(
      int64_t offset,
      absl::Span<const absl::Span<const uint8_t>> pieces) override {
    std::vector<absl::Span<uint8_t>> mutable_pieces;
    mutable_pieces.reserve(pieces.size());
    for (absl::Span<const uint8_t> p : pieces) {
      mutable_pieces.push_back(Mutable(p));
    }
    return file_->Move(true, offset, mutable_pieces);
  }
  absl::Status Reserve(int64_t offset, int64_t bytes) override {
    return file_->Reserve(offset, bytes);
  }
  absl::Status Sync() override { return file_->Sync(); }
  absl::Status Close() override { return file_->Close(); }

 private:
  std::unique_ptr<PosixFile> file_;
};

class PosixReadableFile final : public ReadableFile {
 public:
  explicit PosixReadableFile(std::unique_ptr<PosixFile> file)
      : file_(std::move(file)) {}
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    return file_->Move(false, offset, {&out, 1});
  }
  absl::StatusOr<int64_t> Size() override { return file_->Size(); }

 private:
  std::unique_ptr<PosixFile> file_;
};

// A descriptor closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Opens `name` in `dir_fd` as a regular file: never through a link
// (O_NOFOLLOW), never blocking on a FIFO (O_NONBLOCK, then fstat), with a
// second O_DIRECT descriptor where the filesystem allows, checked to be the
// same file. `flags` is O_RDONLY, or O_WRONLY | O_CREAT | O_EXCL.
absl::StatusOr<std::pair<Fd, Fd>> OpenRegular(int dir_fd, const char* name,
                                              int flags,
                                              const std::string& path) {
  const int common = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
  Fd fd(openat(dir_fd, name, flags | common, 0644));
  if (fd.get() < 0) {
    if (errno == ELOOP) {
      return absl::DataLossError(absl::StrFormat(
          "%s: is a symbolic link; hoist does not follow links out of a "
          "checkpoint",
          path));
    }
    return ErrnoStatus(
        errno, (flags & O_CREAT) ? "create for writing" : "open for reading",
        path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(absl::StrFormat(
        "%s: not a regular file (a FIFO, socket, device or directory); hoist "
        "reads only regular files",
        path));
  }
  // Regular files ignore O_NONBLOCK; clear it all the same.
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  // EINVAL: the filesystem does not do O_DIRECT (tmpfs). Buffered only.
  Fd direct(
      openat(dir_fd, name, (flags & ~(O_CREAT | O_EXCL)) | common | O_DIRECT));
  struct stat direct_st;
  if (direct.get() >= 0 &&
      (fstat(direct.get(), &direct_st) != 0 || direct_st.st_dev != st.st_dev ||
       direct_st.st_ino != st.st_ino)) {
    direct = Fd();  // replaced in between: do without
  }
  return std::make_pair(std::move(fd), std::move(direct));
}

// Removes the entry `name` of the open directory `dir_fd`, descending into
// directories through descriptors (openat with O_NOFOLLOW), so a link is
// removed itself and never followed. `depth` bounds the descent.
absl::Status RemoveEntry(int dir_fd, const std::string& name,
                         const std::string& path, int depth) {
  struct stat st;
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, "stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "unlink", path);
    }
    return absl::OkStatus();
  }
  if (depth > 64) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: nested more than 64 directories deep; hoist makes at most 2 and "
        "removes no deeper tree",
        path));
  }
  const int child = openat(dir_fd, name.c_str(),
                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (child < 0) return ErrnoStatus(errno, "open directory", path);
  DIR* dir = fdopendir(child);
  if (dir == nullptr) {
    const int err = errno;
    close(child);
    return ErrnoStatus(err, "opendir", path);
  }
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string entry_name = entry->d_name;
    if (entry_name != "." && entry_name != "..") names.push_back(entry_name);
  }
  absl::Status status;
  for (const std::string& entry_name : names) {
    status = RemoveEntry(dirfd(dir), entry_name, JoinPath(path, entry_name),
                         depth + 1);
    if (!status.ok()) break;
  }
  closedir(dir);
  if (!status.ok()) return status;
  if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "remove directory", path);
  }
  return absl::OkStatus();
}

// Opens a lock file without following a link or blocking on a FIFO, and
// checks that it is a regular file with one name, owned by this user: only
// then may it be truncated and written.
absl::StatusOr<Fd> OpenLockFile(const std::string& path) {
  Fd fd(open(path.c_str(),
             O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600));
  if (fd.get() < 0) {
    if (errno == ELOOP) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is a symbolic link; hoist never follows a link to lock a root "
          "(remove it)",
          path));
    }
    return ErrnoStatus(errno, "open lock file", path);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat", path);
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s must be a regular file with one name, owned by the user that "
        "opens the root (uid %d); it is %s with %d names, owned by uid %d. "
        "Remove it if the root is yours",
        path, geteuid(), S_ISREG(st.st_mode) ? "a regular file" : "not",
        st.st_nlink, st.st_uid));
  }
  return fd;
}

// flock(2): the lock belongs to the open file, so a second lock on the same
// path fails whether it comes from another process or from this one.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(Fd fd) : fd_(std::move(fd)) {}
  ~PosixFileLock() override { flock(fd_.get(), LOCK_UN); }

 private:
  const Fd fd_;
};

class PosixStorage final : public Storage {
 public:
  explicit PosixStorage(std::unique_ptr<FileIo> io) : io_(std::move(io)) {}

  absl::StatusOr<std::unique_ptr<FileLock>> LockFile(
      const std::string& path, const std::string& holder) override {
    ASSIGN_OR_RETURN(Fd fd, OpenLockFile(path));
    if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) return ErrnoStatus(err, "flock", path);
      char held[256] = {0};
      const ssize_t n = pread(fd.get(), held, sizeof held - 1, 0);
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s is held by %s", path, n > 0 ? std::string(held, n) : "unknown"));
    }
    if (ftruncate(fd.get(), 0) != 0 ||
        pwrite(fd.get(), holder.data(), holder.size(), 0) !=
            static_cast<ssize_t>(holder.size())) {
      return ErrnoStatus(errno, "write lock file", path);
    }
    return std::unique_ptr<FileLock>(new PosixFileLock(std::move(fd)));
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    ASSIGN_OR_RETURN(auto fds, OpenRegular(AT_FDCWD, path.c_str(),
                                           O_WRONLY | O_CREAT | O_EXCL, path));
    return std::make_unique<PosixWritableFile>(std::make_unique<PosixFile>(
        *io_, path, fds.first.release(), fds.second.release()));
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    return Readable(AT_FDCWD, path.c_str(), path);
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadableBeneath(
      const std::string& dir, const std::string& relative) override {
    // `dir` itself may be reached through links (a root the user linked);
    // nothing below it is.
    Fd at(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (at.get() < 0) return ErrnoStatus(errno, "open directory", dir);
    std::string path = dir;
    size_t begin = 0;
    for (size_t slash; (slash = relative.find('/', begin)) != std::string::npos;
         begin = slash + 1) {
      const std::string part = relative.substr(begin, slash - begin);
      path = JoinPath(path, part);
      Fd next(openat(at.get(), part.c_str(),
                     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (next.get() < 0) return NotInsideError(path);
      at = std::move(next);
    }
    return Readable(at.get(), relative.c_str() + begin,
                    JoinPath(dir, relative));
  }

  absl::Status CreateDir(const std::string& path) override {
    if (mkdir(path.c_str(), 0755) != 0)
      return ErrnoStatus(errno, "mkdir", path);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(),
                  RENAME_NOREPLACE) != 0) {
      return ErrnoStatus(errno, absl::StrFormat("rename to %s", to), from);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open directory", path);
    const int rc = fsync(fd);
    const int err = errno;
    close(fd);
    if (rc != 0) return ErrnoStatus(err, "fsync directory", path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> List(
      const std::string& path) override {
    DIR* dir = opendir(path.c_str());
    if (dir == nullptr) return ErrnoStatus(errno, "opendir", path);
    std::vector<std::string> names;
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status RemoveAll(const std::string& given) override {
    // The parent may be reached through links (a linked root); the entry
    // and everything below it are not.
    std::string path = given;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const size_t slash = path.rfind('/');
    if (path == "/" || path.empty() || path == "." || path == "..") {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s': refusing to remove it", given));
    }
    const std::string parent = slash == std::string::npos
                                   ? "."
                                   : (slash == 0 ? "/" : path.substr(0, slash));
    const std::string name =
        slash == std::string::npos ? path : path.substr(slash + 1);
    Fd dir(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir.get() < 0) {
      if (errno == ENOENT) return absl::OkStatus();
      return ErrnoStatus(errno, "open directory", parent);
    }
    return RemoveEntry(dir.get(), name, path, 0);
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoStatus(errno, "stat", path);
  }

  absl::StatusOr<bool> IsDir(const std::string& path) override {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoStatus(errno, "stat", path);
  }

 private:
  absl::StatusOr<std::unique_ptr<ReadableFile>> Readable(
      int dir_fd, const char* name, const std::string& path) {
    ASSIGN_OR_RETURN(auto fds, OpenRegular(dir_fd, name, O_RDONLY, path));
    // With an O_DIRECT descriptor the buffered one reads only the unaligned
    // bits (an extent's last partial 4 KiB): no readahead for them, which
    // would read the next megabytes into the page cache only for the
    // direct reads of those bytes to go around it.
    if (fds.second.get() >= 0) {
      posix_fadvise(fds.first.get(), 0, 0, POSIX_FADV_RANDOM);
    }
    return std::make_unique<PosixReadableFile>(std::make_unique<PosixFile>(
        *io_, path, fds.first.release(), fds.second.release()));
  }

  const std::unique_ptr<FileIo> io_;
};

}  // namespace

std::unique_ptr<Storage> MakePosixStorage() {
  return std::make_unique<PosixStorage>(MakeSyscallFileIo());
}

absl::StatusOr<std::unique_ptr<Storage>> MakeIoUringStorage() {
  absl::StatusOr<std::unique_ptr<FileIo>> io = MakeIoUringFileIo();
  if (!io.ok()) return io.status();
  return std::unique_ptr<Storage>(new PosixStorage(*std::move(io)));
}

}  // namespace hoist
