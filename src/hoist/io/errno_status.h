// errno -> absl::Status, with the codes Storage documents.
#ifndef HOIST_IO_ERRNO_STATUS_H_
#define HOIST_IO_ERRNO_STATUS_H_

#include <string_view>

#include "absl/status/status.h"

namespace hoist {

// "PATH: OPERATION: strerror(err)", coded: ENOENT/ENOTDIR kNotFound,
// EEXIST/ENOTEMPTY kAlreadyExists, ENOSPC/EDQUOT kResourceExhausted,
// EACCES/EPERM/EROFS kPermissionDenied, EINVAL kInvalidArgument, EIO and
// anything else kAborted (the checkpoint failed; retry it).
absl::Status ErrnoStatus(int err, std::string_view operation,
                         std::string_view path);

// kDataLoss "PATH: not a directory inside the checkpoint": a directory on
// the way to a file is missing or a link (Storage::OpenReadableBeneath).
absl::Status NotInsideError(const std::string& path);

}  // namespace hoist

#endif  // HOIST_IO_ERRNO_STATUS_H_
