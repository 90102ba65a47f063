// Element types of the arrays hoist saves, named as numpy / ml_dtypes name
// them ("bfloat16", "float8_e4m3fn"), which is also how MANIFEST.json spells
// them.
#ifndef HOIST_DTYPE_H_
#define HOIST_DTYPE_H_

#include <array>
#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace hoist {

enum class DType : uint8_t {
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kFloat8E4M3FN,
  kFloat8E5M2,
};

// Every DType, in declaration order.
inline constexpr std::array<DType, 15> kAllDTypes = {
    DType::kBool,    DType::kInt8,         DType::kInt16,     DType::kInt32,
    DType::kInt64,   DType::kUint8,        DType::kUint16,    DType::kUint32,
    DType::kUint64,  DType::kFloat16,      DType::kBFloat16,  DType::kFloat32,
    DType::kFloat64, DType::kFloat8E4M3FN, DType::kFloat8E5M2};

// Bytes per element: 1, 2, 4 or 8.
int64_t ItemSize(DType dtype);

// The numpy / ml_dtypes name: "bool", "int8", …, "bfloat16", "float8_e5m2".
std::string_view DTypeName(DType dtype);

// The inverse of DTypeName. kInvalidArgument names the unknown text.
absl::StatusOr<DType> ParseDType(std::string_view name);

}  // namespace hoist

#endif  // HOIST_DTYPE_H_
