// Box: an n-dimensional index box, the unit in which hoist speaks about parts
// of arrays (a device's shard, a replica's slice, a manifest extent).
#ifndef HOIST_BOX_H_
#define HOIST_BOX_H_

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hoist {

// A half-open n-d box of array indices: dimension d covers
// [origin[d], origin[d] + shape[d]). Rank 0 is a scalar (one element).
// A value type; all methods are const and thread-compatible.
class Box {
 public:
  // The rank-0 box (one element).
  Box() = default;
  // Precondition: origin.size() == shape.size() and every shape[d] >= 0.
  // Use Box::Create to validate untrusted input.
  Box(std::vector<int64_t> origin, std::vector<int64_t> shape);

  // Validates and builds a box. kInvalidArgument if the ranks differ, a size
  // or an origin is negative, or origin + shape overflows.
  static absl::StatusOr<Box> Create(std::vector<int64_t> origin,
                                    std::vector<int64_t> shape);

  // The box at origin 0 covering `shape` (all sizes >= 0).
  static Box FromShape(absl::Span<const int64_t> shape);

  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& origin() const { return origin_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // One past the last index along `dim`.
  int64_t limit(int dim) const { return origin_[dim] + shape_[dim]; }

  // Product of the sizes (1 for rank 0). Precondition: it fits in int64_t,
  // which holds for any box inside a shape accepted by CheckedNumElements.
  int64_t num_elements() const;
  // True when some size is 0.
  bool empty() const;

  // The common part of two boxes of equal rank; empty() when they are
  // disjoint (then its shape has a 0 and its origin is unspecified).
  Box Intersect(const Box& other) const;
  // True when every index of `other` lies in this box. An empty `other` of
  // the same rank is contained in any box.
  bool Contains(const Box& other) const;
  bool ContainsIndex(absl::Span<const int64_t> index) const;

  // Splits along `axis` into `parts` boxes whose sizes differ by at most one,
  // the larger first, in index order. Precondition:
  // 1 <= parts <= shape()[axis] (every part is non-empty).
  std::vector<Box> Split(int axis, int64_t parts) const;

  // This box with its origin made relative to `outer`'s origin.
  // Precondition: outer.Contains(*this).
  Box RelativeTo(const Box& outer) const;

  // "[0:4, 8:16]"; "[]" for rank 0.
  std::string ToString() const;

  friend bool operator==(const Box&, const Box&) = default;
  // Lexicographic by origin, then shape: a deterministic order for plans.
  friend auto operator<=>(const Box&, const Box&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Box& box) {
    return H::combine(std::move(h), box.origin_, box.shape_);
  }

 private:
  std::vector<int64_t> origin_;
  std::vector<int64_t> shape_;
};

// Element strides of a dense C-order (row-major) array of `shape`: the last
// dimension has stride 1. Precondition: the element count fits in int64_t.
std::vector<int64_t> CStrides(absl::Span<const int64_t> shape);

// Element count of `shape`. kInvalidArgument for a negative size or a count
// that overflows int64_t.
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape);

// "(8, 1024)" for error messages.
std::string ShapeToString(absl::Span<const int64_t> shape);

// Copies the elements of `region` from `src` (the dense C-order bytes of
// `src_box`) into `dst` (those of `dst_box`), as restore does when it moves
// the part of a saved extent that a target box needs. Elements are
// `item_bytes` each. Preconditions: equal ranks, and both boxes contain
// `region`. Trailing dimensions that both boxes span whole are copied as
// one run; runs of 4 KiB or more with non-temporal stores (StreamCopy,
// hoist/base/stream_copy.h: the restored bytes are the job's to read later,
// not this copy's to keep in the cache).
void CopyBox(const uint8_t* src, const Box& src_box, uint8_t* dst,
             const Box& dst_box, const Box& region, int64_t item_bytes);

// If `inner`'s elements form one contiguous run of `outer`'s dense C-order
// bytes (`outer` contains `inner`), the byte offset where that run starts;
// else nullopt. Elements are `item_bytes` each.
std::optional<int64_t> ContiguousByteOffset(const Box& outer, const Box& inner,
                                            int64_t item_bytes);

// The bytes `inner`'s elements occupy within `outer`'s dense C-order bytes,
// from its first element's to the end of its last: [first, end). Exactly
// its bytes when it is one contiguous run, else a range with gaps.
// Preconditions: `outer` contains `inner`, which is not empty.
std::pair<int64_t, int64_t> ByteSpan(const Box& outer, const Box& inner,
                                     int64_t item_bytes);

// The most dimensions an array may have (NumPy's limit).
inline constexpr int kMaxRank = 64;

// Two boxes of a list that share an element, by index (first < second).
struct BoxOverlap {
  size_t first = 0;
  size_t second = 0;
};

// Whether `boxes` (all of one rank; empty boxes never overlap) are pairwise
// disjoint: nullopt if they are, else one overlapping pair. Near-linear for
// the tilings hoist makes and meets (a grid of shards, each cut into slices
// along one axis, or any partition by successive straight cuts): it cuts the
// set where no box crosses, along each axis in turn, and compares boxes
// pairwise only inside a group that no cut separates. kResourceExhausted if
// that would take more than about 64 comparisons per box plus a million (a
// tiling of interlocking boxes, "pinwheels", with thousands of boxes in one
// group): the work is bounded whatever the input.
absl::StatusOr<std::optional<BoxOverlap>> FindOverlap(
    absl::Span<const Box> boxes);

}  // namespace hoist

#endif  // HOIST_BOX_H_
