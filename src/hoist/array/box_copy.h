// Copies the elements of one index box between two dense row-major buffers
// that hold other (larger) boxes, as restore does when it moves the part of
// a saved extent that a target shard needs.
#ifndef HOIST_ARRAY_BOX_COPY_H_
#define HOIST_ARRAY_BOX_COPY_H_

#include <cstdint>

#include "hoist/box.h"

namespace hoist {

// Copies `region` from `src` (the dense C-order bytes of `src_box`) into
// `dst` (those of `dst_box`). Elements are `item_bytes` each. Preconditions:
// equal ranks, and both boxes contain `region`. Trailing dimensions that
// both boxes span whole are copied as one run.
void CopyBox(const uint8_t* src, const Box& src_box, uint8_t* dst,
             const Box& dst_box, const Box& region, int64_t item_bytes);

}  // namespace hoist

#endif  // HOIST_ARRAY_BOX_COPY_H_
