// Sizes shared by the checkpoint's readers and writers.
#ifndef HOIST_IO_IO_SIZES_H_
#define HOIST_IO_IO_SIZES_H_

#include <cstdint>

#include "hoist/save_plan.h"

namespace hoist {

// The most bytes one vectored write or read run covers, and the largest
// piece a scattered extent is read in: it bounds every reader's and
// writer's buffer, whatever a manifest claims.
inline constexpr int64_t kMaxIoRunBytes = int64_t{16} << 20;

// Restore reads an extent straight into its destination (no copy) when the
// destination's bytes start 4 KiB-aligned (as O_DIRECT needs) and the
// extent is at least this long; smaller extents are read together, in runs
// of neighbours in one file, and copied out: one read for thousands of
// small arrays instead of one each. A save lays the small ones out together
// (kSmallSliceBytes) so that they are neighbours.
inline constexpr int64_t kMinDirectReadBytes = kSmallSliceBytes;

}  // namespace hoist

#endif  // HOIST_IO_IO_SIZES_H_
