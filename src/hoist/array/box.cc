#include "hoist/box.h"

#include <algorithm>
#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hoist/base/checked_math.h"

namespace hoist {

Box::Box(std::vector<int64_t> origin, std::vector<int64_t> shape)
    : origin_(std::move(origin)), shape_(std::move(shape)) {
  assert(origin_.size() == shape_.size());
}

absl::StatusOr<Box> Box::Create(std::vector<int64_t> origin,
                                std::vector<int64_t> shape) {
  if (origin.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("box origin has rank %d but its shape has rank %d",
                        origin.size(), shape.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (origin[d] < 0 || shape[d] < 0 ||
        !CheckedAdd(origin[d], shape[d]).has_value()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "box dimension %d has origin %d and size %d: both must be >= 0 and "
          "their sum must fit in int64",
          d, origin[d], shape[d]));
    }
  }
  return Box(std::move(origin), std::move(shape));
}

Box Box::FromShape(absl::Span<const int64_t> shape) {
  return Box(std::vector<int64_t>(shape.size(), 0),
             std::vector<int64_t>(shape.begin(), shape.end()));
}

int64_t Box::num_elements() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

bool Box::empty() const {
  return std::find(shape_.begin(), shape_.end(), 0) != shape_.end();
}

Box Box::Intersect(const Box& other) const {
  assert(rank() == other.rank());
  std::vector<int64_t> origin(rank()), shape(rank());
  for (int d = 0; d < rank(); ++d) {
    const int64_t lo = std::max(origin_[d], other.origin_[d]);
    const int64_t hi = std::min(limit(d), other.limit(d));
    origin[d] = lo;
    shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return Box(std::move(origin), std::move(shape));
}

bool Box::Contains(const Box& other) const {
  if (rank() != other.rank()) return false;
  if (other.empty()) return true;
  for (int d = 0; d < rank(); ++d) {
    if (other.origin_[d] < origin_[d] || other.limit(d) > limit(d)) {
      return false;
    }
  }
  return true;
}

bool Box::ContainsIndex(absl::Span<const int64_t> index) const {
  if (static_cast<int>(index.size()) != rank()) return false;
  for (int d = 0; d < rank(); ++d) {
    if (index[d] < origin_[d] || index[d] >= limit(d)) return false;
  }
  return true;
}

std::vector<Box> Box::Split(int axis, int64_t parts) const {
  assert(axis >= 0 && axis < rank());
  assert(parts >= 1 && parts <= shape_[axis]);
  std::vector<Box> out;
  out.reserve(parts);
  const int64_t base = shape_[axis] / parts;
  const int64_t extra = shape_[axis] % parts;
  int64_t start = origin_[axis];
  for (int64_t i = 0; i < parts; ++i) {
    Box part = *this;
    part.origin_[axis] = start;
    part.shape_[axis] = base + (i < extra ? 1 : 0);
    start += part.shape_[axis];
    out.push_back(std::move(part));
  }
  return out;
}

Box Box::RelativeTo(const Box& outer) const {
  assert(outer.Contains(*this));
  Box out = *this;
  for (int d = 0; d < rank(); ++d) out.origin_[d] -= outer.origin_[d];
  return out;
}

std::string Box::ToString() const {
  std::vector<std::string> dims;
  dims.reserve(rank());
  for (int d = 0; d < rank(); ++d) {
    dims.push_back(absl::StrFormat("%d:%d", origin_[d], limit(d)));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

std::vector<int64_t> CStrides(absl::Span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("shape %s has negative size %d in dimension %d",
                          ShapeToString(shape), shape[d], d));
    }
    std::optional<int64_t> product = CheckedMul(n, shape[d]);
    if (!product) {
      return absl::InvalidArgumentError(
          absl::StrFormat("shape %s has more elements than fit in int64",
                          ShapeToString(shape)));
    }
    n = *product;
  }
  return n;
}

std::optional<int64_t> ContiguousByteOffset(const Box& outer, const Box& inner,
                                            int64_t item_bytes) {
  // Leading dims of size 1 in inner, then one partial dim, then full dims.
  int d = 0;
  while (d < inner.rank() && inner.shape()[d] == 1) ++d;
  for (int e = d + 1; e < inner.rank(); ++e) {
    if (inner.shape()[e] != outer.shape()[e]) return std::nullopt;
  }
  const std::vector<int64_t> strides = CStrides(outer.shape());
  int64_t offset = 0;
  for (int e = 0; e < inner.rank(); ++e) {
    offset += (inner.origin()[e] - outer.origin()[e]) * strides[e];
  }
  return offset * item_bytes;
}

std::pair<int64_t, int64_t> ByteSpan(const Box& outer, const Box& inner,
                                     int64_t item_bytes) {
  const std::vector<int64_t> strides = CStrides(outer.shape());
  int64_t first = 0, last = 0;
  for (int d = 0; d < inner.rank(); ++d) {
    const int64_t from = inner.origin()[d] - outer.origin()[d];
    first += from * strides[d];
    last += (from + inner.shape()[d] - 1) * strides[d];
  }
  return {first * item_bytes, (last + 1) * item_bytes};
}

absl::StatusOr<std::optional<BoxOverlap>> FindOverlap(
    absl::Span<const Box> boxes) {
  std::vector<size_t> nonempty;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (!boxes[i].empty()) nonempty.push_back(i);
  }
  if (nonempty.size() < 2) return std::nullopt;
  const int rank = boxes[nonempty[0]].rank();
  const auto pair = [](size_t a, size_t b) {
    return BoxOverlap{std::min(a, b), std::max(a, b)};
  };
  if (rank == 0) return pair(nonempty[0], nonempty[1]);
  // Groups still to separate, each with the axis to try first; a worklist,
  // not recursion, so no input can exhaust the stack.
  struct Group {
    std::vector<size_t> boxes;
    int axis = 0;
  };
  std::vector<Group> work;
  const int64_t budget =
      64 * static_cast<int64_t>(nonempty.size()) + (int64_t{1} << 20);
  int64_t spent = 0;
  work.push_back({std::move(nonempty), 0});
  while (!work.empty()) {
    Group group = std::move(work.back());
    work.pop_back();
    std::vector<size_t>& g = group.boxes;
    if (g.size() < 2) continue;
    bool cut = false;
    for (int k = 0; k < rank && !cut; ++k) {
      const int axis = (group.axis + k) % rank;
      spent += static_cast<int64_t>(g.size());
      if (spent > budget) break;
      std::sort(g.begin(), g.end(), [&](size_t a, size_t b) {
        return boxes[a].origin()[axis] < boxes[b].origin()[axis];
      });
      // A cut lies before box i when no earlier box reaches past its origin.
      size_t start = 0;
      int64_t reach = boxes[g[0]].limit(axis);
      for (size_t i = 1; i <= g.size(); ++i) {
        if (i < g.size() && boxes[g[i]].origin()[axis] < reach) {
          reach = std::max(reach, boxes[g[i]].limit(axis));
          continue;
        }
        if (start == 0 && i == g.size()) break;  // no cut on this axis
        cut = true;
        work.push_back({std::vector<size_t>(g.begin() + start, g.begin() + i),
                        (axis + 1) % rank});
        start = i;
        if (i < g.size()) reach = boxes[g[i]].limit(axis);
      }
    }
    if (spent > budget) break;
    if (cut) continue;
    // No straight cut separates this group: compare pairwise, in order of
    // the last axis tried (sorted), stopping once boxes start past the end.
    const int axis = (group.axis + rank - 1) % rank;
    for (size_t i = 0; i < g.size() && spent <= budget; ++i) {
      for (size_t j = i + 1; j < g.size(); ++j) {
        if (boxes[g[j]].origin()[axis] >= boxes[g[i]].limit(axis)) break;
        if (++spent > budget) break;
        if (!boxes[g[i]].Intersect(boxes[g[j]]).empty()) {
          return pair(g[i], g[j]);
        }
      }
    }
  }
  if (spent > budget) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%d boxes interlock too much to check that they are disjoint within "
        "%d comparisons (no straight cut separates them)",
        boxes.size(), budget));
  }
  return std::nullopt;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  if (shape.size() == 1) return absl::StrFormat("(%d,)", shape[0]);
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace hoist
