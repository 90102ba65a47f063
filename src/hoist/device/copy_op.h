// Helpers every backend uses on CopyOps: validation and normalization.
#ifndef HOIST_DEVICE_COPY_OP_H_
#define HOIST_DEVICE_COPY_OP_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/device.h"

namespace hoist {

// Checks every op and returns the ones that copy something, with
// contiguous multi-row ops (both pitches == width) folded into one row.
// kInvalidArgument naming the op for negative sizes, a null pointer with
// bytes to copy, a pitch smaller than the width, or a byte count that
// overflows int64_t.
absl::StatusOr<std::vector<CopyOp>> NormalizeCopyOps(
    absl::Span<const CopyOp> ops);

}  // namespace hoist

#endif  // HOIST_DEVICE_COPY_OP_H_
