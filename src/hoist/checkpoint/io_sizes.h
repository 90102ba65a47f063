// Sizes shared by the checkpoint's readers and writers.
#ifndef HOIST_CHECKPOINT_IO_SIZES_H_
#define HOIST_CHECKPOINT_IO_SIZES_H_

#include <cstdint>

namespace hoist {

// The most bytes one vectored write or read run covers, and the largest
// piece a scattered extent is read in: it bounds every reader's and
// writer's buffer, whatever a manifest claims.
inline constexpr int64_t kMaxIoRunBytes = int64_t{16} << 20;

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_IO_SIZES_H_
