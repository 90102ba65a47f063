// Test helper: how many times each element of an array is covered by boxes.
#ifndef HOIST_TESTING_COVERAGE_H_
#define HOIST_TESTING_COVERAGE_H_

#include <cstdint>
#include <vector>

#include "hoist/box.h"

namespace hoist::testing {

// Calls fn(flat C-order index in `shape`) for every index of `box`.
template <typename Fn>
void ForEachIndex(const Box& box, const std::vector<int64_t>& shape, Fn fn) {
  if (box.empty()) return;
  const std::vector<int64_t> strides = CStrides(shape);
  std::vector<int64_t> index = box.origin();
  for (int64_t n = 0; n < box.num_elements(); ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat += index[d] * strides[d];
    fn(flat);
    for (int d = box.rank(); d-- > 0;) {
      if (++index[d] < box.limit(d)) break;
      index[d] = box.origin()[d];
    }
  }
}

// Per element of `shape`, the number of `boxes` containing it.
inline std::vector<int> Coverage(const std::vector<Box>& boxes,
                                 const std::vector<int64_t>& shape) {
  std::vector<int> count(Box::FromShape(shape).num_elements(), 0);
  for (const Box& box : boxes) {
    ForEachIndex(box, shape, [&](int64_t flat) { ++count[flat]; });
  }
  return count;
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_COVERAGE_H_
