// POSIX storage. Writable files keep two descriptors: a buffered one, and one
// opened with O_DIRECT where the filesystem allows it (tmpfs refuses; then
// every write is buffered). A write whose offset, length and buffer are all
// 4 KiB-aligned goes through O_DIRECT, skipping the page cache; an aligned
// write with an unaligned tail writes its aligned body directly and the tail
// buffered. If the O_DIRECT descriptor refuses a write with EINVAL, the file
// falls back to buffered writes for good. Sync() is fsync on the buffered
// descriptor, which also makes the O_DIRECT writes' metadata durable.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/io/errno_status.h"
#include "hoist/storage.h"

namespace hoist {
namespace {

constexpr int64_t kDirectAlignment = 4096;

bool Aligned(int64_t value) { return value % kDirectAlignment == 0; }

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, int direct_fd)
      : path_(std::move(path)), fd_(fd), direct_fd_(direct_fd) {}
  ~PosixWritableFile() override { Close().IgnoreError(); }

  absl::Status WriteAt(int64_t offset,
                       absl::Span<const uint8_t> data) override {
    if (fd_ < 0) return Closed();
    if (offset < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: negative write offset %d", path_, offset));
    }
    const int64_t size = static_cast<int64_t>(data.size());
    const int64_t body = size / kDirectAlignment * kDirectAlignment;
    if (direct_fd_ >= 0 && direct_ok_.load(std::memory_order_relaxed) &&
        Aligned(offset) && body > 0 &&
        Aligned(reinterpret_cast<uintptr_t>(data.data()))) {
      absl::Status status = WriteAll(direct_fd_, offset, data.first(body));
      if (status.ok()) {
        if (body == size) return status;
        return WriteAll(fd_, offset + body, data.subspan(body));
      }
      if (!absl::IsInvalidArgument(status)) return status;
      direct_ok_.store(false, std::memory_order_relaxed);  // fall back
    }
    return WriteAll(fd_, offset, data);
  }

  // One pwritev per IOV_MAX pieces; O_DIRECT when every piece is aligned.
  absl::Status WriteAtv(
      int64_t offset,
      absl::Span<const absl::Span<const uint8_t>> pieces) override {
    if (fd_ < 0) return Closed();
    bool aligned = Aligned(offset);
    std::vector<iovec> iov;
    iov.reserve(pieces.size());
    for (absl::Span<const uint8_t> piece : pieces) {
      aligned &= Aligned(static_cast<int64_t>(piece.size())) &&
                 Aligned(reinterpret_cast<uintptr_t>(piece.data()));
      iov.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
    }
    if (aligned && direct_fd_ >= 0 &&
        direct_ok_.load(std::memory_order_relaxed)) {
      absl::Status status = WriteAllv(direct_fd_, offset, iov);
      if (!absl::IsInvalidArgument(status)) return status;
      direct_ok_.store(false, std::memory_order_relaxed);  // fall back
    }
    return WriteAllv(fd_, offset, iov);
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed();
    if (fsync(fd_) != 0) return ErrnoStatus(errno, "fsync", path_);
    return absl::OkStatus();
  }

  absl::Status Close() override {
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
  absl::Status Closed() const {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: file is closed", path_));
  }

  absl::Status WriteAll(int fd, int64_t offset,
                        absl::Span<const uint8_t> data) {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n =
          pwrite(fd, data.data() + done, data.size() - done, offset + done);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && fd == direct_fd_) {
          return absl::InvalidArgumentError("O_DIRECT refused");
        }
        return ErrnoStatus(errno,
                           absl::StrFormat("pwrite of %d bytes at offset %d",
                                           data.size() - done, offset + done),
                           path_);
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  // pwritev until every byte of `iov` is written (it is consumed).
  absl::Status WriteAllv(int fd, int64_t offset, std::vector<iovec> iov) {
    size_t first = 0;
    while (first < iov.size()) {
      const int count =
          static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      const ssize_t n = pwritev(fd, &iov[first], count, offset);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && fd == direct_fd_) {
          return absl::InvalidArgumentError("O_DIRECT refused");
        }
        return ErrnoStatus(
            errno, absl::StrFormat("pwritev at offset %d", offset), path_);
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

  const std::string path_;
  int fd_;
  int direct_fd_;
  std::atomic<bool> direct_ok_{true};
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd, int direct_fd)
      : path_(std::move(path)), fd_(fd), direct_fd_(direct_fd) {}
  ~PosixReadableFile() override {
    close(fd_);
    if (direct_fd_ >= 0) close(direct_fd_);
  }

  // An aligned read (offset and buffer 4 KiB-aligned) reads its aligned body
  // with O_DIRECT, bypassing the page cache, and any tail buffered.
  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    const int64_t size = static_cast<int64_t>(out.size());
    const int64_t body = size / kDirectAlignment * kDirectAlignment;
    if (direct_fd_ >= 0 && direct_ok_.load(std::memory_order_relaxed) &&
        Aligned(offset) && body > 0 &&
        Aligned(reinterpret_cast<uintptr_t>(out.data()))) {
      absl::Status status = ReadAll(direct_fd_, offset, out.first(body));
      if (status.ok()) {
        if (body == size) return status;
        return ReadAll(fd_, offset + body, out.subspan(body));
      }
      if (!absl::IsInvalidArgument(status)) return status;
      direct_ok_.store(false, std::memory_order_relaxed);  // fall back
    }
    return ReadAll(fd_, offset, out);
  }

  absl::StatusOr<int64_t> Size() override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return ErrnoStatus(errno, "fstat", path_);
    return static_cast<int64_t>(st.st_size);
  }

 private:
  absl::Status ReadAll(int fd, int64_t offset, absl::Span<uint8_t> out) {
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n =
          pread(fd, out.data() + done, out.size() - done, offset + done);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && fd == direct_fd_) {
          return absl::InvalidArgumentError("O_DIRECT refused");
        }
        return ErrnoStatus(errno,
                           absl::StrFormat("pread of %d bytes at offset %d",
                                           out.size() - done, offset + done),
                           path_);
      }
      if (n == 0) {
        return absl::DataLossError(absl::StrFormat(
            "%s: truncated: needed %d bytes at offset %d, the file ends at %d",
            path_, out.size(), offset, offset + done));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  const std::string path_;
  const int fd_;
  const int direct_fd_;
  std::atomic<bool> direct_ok_{true};
};

class PosixStorage final : public Storage {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "open for writing", path);
    // EINVAL: the filesystem does not do O_DIRECT (tmpfs). Buffered only.
    const int direct_fd = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    return std::make_unique<PosixWritableFile>(path, fd, direct_fd);
  }

  absl::StatusOr<std::unique_ptr<ReadableFile>> OpenReadable(
      const std::string& path) override {
    // O_NOFOLLOW: a data file that is a symlink could point anywhere.
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ELOOP) {
        return absl::DataLossError(absl::StrFormat(
            "%s: is a symbolic link; hoist does not follow links out of a "
            "checkpoint",
            path));
      }
      return ErrnoStatus(errno, "open for reading", path);
    }
    const int direct_fd =
        open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
    return std::make_unique<PosixReadableFile>(path, fd, direct_fd);
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

  absl::Status RemoveAll(const std::string& path) override {
    std::error_code error;
    std::filesystem::remove_all(path, error);
    if (error) return ErrnoStatus(error.value(), "remove", path);
    return absl::OkStatus();
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
};

}  // namespace

std::unique_ptr<Storage> MakePosixStorage() {
  return std::make_unique<PosixStorage>();
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace hoist
