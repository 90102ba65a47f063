// FileIo: how a POSIX file's bytes move. The syscall engine calls
// pwritev/preadv/fsync; the io_uring engine submits the same operations to a
// ring borrowed for the call and waits for their completion. Storage
// semantics (O_DIRECT choice, error mapping, short transfers) live above, in
// posix_storage.cc, the same for both.
#ifndef HOIST_IO_FILE_IO_H_
#define HOIST_IO_FILE_IO_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace hoist {

class FileIo {
 public:
  virtual ~FileIo() = default;
  // As pwritev / preadv: bytes moved (possibly short), or -errno.
  virtual ssize_t Writev(int fd, const iovec* iov, int count,
                         int64_t offset) = 0;
  virtual ssize_t Readv(int fd, const iovec* iov, int count,
                        int64_t offset) = 0;
  // As fsync: 0 or -errno.
  virtual int Fsync(int fd) = 0;
};

// Plain syscalls. Never fails.
std::unique_ptr<FileIo> MakeSyscallFileIo();

// io_uring (liburing): each call borrows a ring from the engine's pool (one
// ring per concurrent caller, kept for the engine's life). kUnavailable with
// the reason when the kernel or the build has no io_uring.
absl::StatusOr<std::unique_ptr<FileIo>> MakeIoUringFileIo();

}  // namespace hoist

#endif  // HOIST_IO_FILE_IO_H_
