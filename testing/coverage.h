// Test helper: how many times each element of an array is covered by boxes.
#ifndef HOIST_TESTING_COVERAGE_H_
#define HOIST_TESTING_COVERAGE_H_

#include <cstdint>
#include <vector>

#include "hoist/box.h"

namespace hoist::testing {

// Calls fn(flat C-order index in `shape`) for every index of `box`, in C
// order: row by row along the last axis, whose indices are consecutive (the
// tests' expected bytes come from here, element by element, so the
// per-element work is one call).
template <typename Fn>
void ForEachIndex(const Box& box, const std::vector<int64_t>& shape, Fn fn) {
  if (box.empty()) return;
  const int rank = box.rank();
  if (rank == 0) {
    fn(0);
    return;
  }
  const std::vector<int64_t> strides = CStrides(shape);
  const std::vector<int64_t>& origin = box.origin();
  std::vector<int64_t> limit(rank);
  for (int d = 0; d < rank; ++d) limit[d] = box.limit(d);
  const int64_t row = limit[rank - 1] - origin[rank - 1];
  const int64_t rows = box.num_elements() / row;
  std::vector<int64_t> index = origin;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t flat = 0;
    for (int d = 0; d < rank; ++d) flat += index[d] * strides[d];
    for (int64_t i = 0; i < row; ++i) fn(flat + i);
    for (int d = rank - 1; d-- > 0;) {
      if (++index[d] < limit[d]) break;
      index[d] = origin[d];
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
