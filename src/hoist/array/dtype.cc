#include "hoist/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hoist {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int64_t item_size;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kBool, "bool", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUint8, "uint8", 1},
    {DType::kUint16, "uint16", 2},
    {DType::kUint32, "uint32", 4},
    {DType::kUint64, "uint64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
};
static_assert(std::size(kInfo) == kAllDTypes.size());

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<size_t>(dtype)]; }

}  // namespace

int64_t ItemSize(DType dtype) { return Info(dtype).item_size; }

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown dtype '%s' (expected a numpy / ml_dtypes name such as "
      "'float32', 'bfloat16' or 'float8_e4m3fn')",
      name));
}

}  // namespace hoist
