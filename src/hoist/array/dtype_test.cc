#include "hoist/dtype.h"

#include <gtest/gtest.h>

#include <set>

namespace hoist {
namespace {

TEST(DTypeTest, NamesAndItemSizesMatchNumpy) {
  EXPECT_EQ(DTypeName(DType::kBool), "bool");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kFloat8E4M3FN), "float8_e4m3fn");
  EXPECT_EQ(DTypeName(DType::kFloat8E5M2), "float8_e5m2");
  EXPECT_EQ(DTypeName(DType::kUint64), "uint64");
  EXPECT_EQ(ItemSize(DType::kBool), 1);
  EXPECT_EQ(ItemSize(DType::kInt16), 2);
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2);
  EXPECT_EQ(ItemSize(DType::kFloat16), 2);
  EXPECT_EQ(ItemSize(DType::kFloat32), 4);
  EXPECT_EQ(ItemSize(DType::kUint32), 4);
  EXPECT_EQ(ItemSize(DType::kInt64), 8);
  EXPECT_EQ(ItemSize(DType::kFloat64), 8);
  EXPECT_EQ(ItemSize(DType::kFloat8E4M3FN), 1);
}

TEST(DTypeTest, EveryNameParsesBackToItsDType) {
  std::set<std::string_view> names;
  for (DType dtype : kAllDTypes) {
    EXPECT_TRUE(names.insert(DTypeName(dtype)).second) << DTypeName(dtype);
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DTypeTest, UnknownNameIsInvalidArgumentNamingIt) {
  absl::StatusOr<DType> parsed = ParseDType("float128");
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("float128"), std::string::npos);
  EXPECT_FALSE(ParseDType("").ok());
  EXPECT_FALSE(ParseDType("Float32").ok());
}

}  // namespace
}  // namespace hoist
