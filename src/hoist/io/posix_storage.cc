// POSIX storage, over a FileIo engine (syscalls or io_uring). Files keep two
// descriptors: a buffered one, and one opened with O_DIRECT where the
// filesystem allows it (tmpfs refuses; then every transfer is buffered). A
// transfer whose offset, buffers and lengths are 4 KiB-aligned goes through
// O_DIRECT, skipping the page cache; an unaligned tail goes buffered. If the
// O_DIRECT descriptor refuses a transfer with EINVAL, the file falls back to
// buffered I/O for good. Sync() is fsync on the buffered descriptor, which
// also makes the O_DIRECT writes' metadata durable. Data files are opened
// for reading with O_NOFOLLOW: hoist never follows a link out of a
// checkpoint.
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

class PosixStorage final : public Storage {
 public:
  explicit PosixStorage(std::unique_ptr<FileIo> io) : io_(std::move(io)) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> OpenWritable(
      const std::string& path) override {
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "open for writing", path);
    // EINVAL: the filesystem does not do O_DIRECT (tmpfs). Buffered only.
    const int direct_fd = open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    return std::make_unique<PosixWritableFile>(
        std::make_unique<PosixFile>(*io_, path, fd, direct_fd));
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
    return std::make_unique<PosixReadableFile>(
        std::make_unique<PosixFile>(*io_, path, fd, direct_fd));
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

 private:
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

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace hoist
