#include <cassert>
#include <vector>

#include "hoist/base/stream_copy.h"
#include "hoist/box.h"

namespace hoist {

void CopyBox(const uint8_t* src, const Box& src_box, uint8_t* dst,
             const Box& dst_box, const Box& region, int64_t item_bytes) {
  assert(src_box.Contains(region) && dst_box.Contains(region));
  if (region.empty()) return;
  const int rank = region.rank();
  // Dimensions [first_run, rank) form one contiguous run in both buffers:
  // every dimension after first_run is spanned whole by region and both boxes.
  int first_run = rank;
  int64_t run_bytes = item_bytes;
  while (first_run > 0) {
    const int d = first_run - 1;
    run_bytes *= region.shape()[d];
    --first_run;
    if (region.shape()[d] != src_box.shape()[d] ||
        region.shape()[d] != dst_box.shape()[d]) {
      break;
    }
  }
  const std::vector<int64_t> src_strides = CStrides(src_box.shape());
  const std::vector<int64_t> dst_strides = CStrides(dst_box.shape());
  // Odometer over dimensions [0, first_run).
  std::vector<int64_t> index(region.origin().begin(),
                             region.origin().begin() + first_run);
  StreamCopies runs;  // fenced once, on return
  while (true) {
    int64_t src_at = 0, dst_at = 0;
    for (int d = 0; d < rank; ++d) {
      const int64_t i = d < first_run ? index[d] : region.origin()[d];
      src_at += (i - src_box.origin()[d]) * src_strides[d];
      dst_at += (i - dst_box.origin()[d]) * dst_strides[d];
    }
    runs.Copy(dst + dst_at * item_bytes, src + src_at * item_bytes, run_bytes);
    int d = first_run - 1;
    for (; d >= 0; --d) {
      if (++index[d] < region.limit(d)) break;
      index[d] = region.origin()[d];
    }
    if (d < 0) return;
  }
}

}  // namespace hoist
