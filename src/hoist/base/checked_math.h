// Overflow-checked integer arithmetic for sizes, offsets and element counts.
//
// Every count hoist derives from user input (a shape, a box, a manifest) goes
// through these helpers, so a hostile or mistaken size yields an error value
// instead of wrapping around.
#ifndef HOIST_BASE_CHECKED_MATH_H_
#define HOIST_BASE_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

namespace hoist {

// a * b, or nullopt if the product overflows int64_t.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt if the sum overflows int64_t.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The smallest multiple of `alignment` (> 0) that is >= value (>= 0).
// Precondition: the result fits in int64_t.
constexpr int64_t AlignUp(int64_t value, int64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace hoist

#endif  // HOIST_BASE_CHECKED_MATH_H_
