#include "hoist/io/errno_status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace hoist {

absl::Status ErrnoStatus(int err, std::string_view operation,
                         std::string_view path) {
  const std::string message =
      absl::StrFormat("%s: %s: %s", path, operation, std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case EINVAL:
      return absl::InvalidArgumentError(message);
    default:
      return absl::AbortedError(message);
  }
}

}  // namespace hoist
