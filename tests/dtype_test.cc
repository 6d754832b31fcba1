// base/dtype.h: the dtype table is complete, and every property derives from it.
#include <gtest/gtest.h>

#include <set>
#include <string_view>
#include <utility>

#include "base/dtype.h"

namespace mhckpt {
namespace {

// The compiler's own spelling of the value V inside a template's signature:
// "mhckpt::DType::kInt8" for an enumerator, "(mhckpt::DType)15" for a number
// that no enumerator names (GCC and Clang both spell it so).
template <DType V>
constexpr bool IsEnumerator() {
  constexpr std::string_view f = __PRETTY_FUNCTION__;
  constexpr size_t at = f.find("V = ");
  static_assert(at != std::string_view::npos, "unexpected __PRETTY_FUNCTION__ form");
  return f[at + 4] != '(';
}

template <size_t... I>
std::set<int> Enumerators(std::index_sequence<I...>) {
  std::set<int> out;
  ((IsEnumerator<static_cast<DType>(I)>() ? void(out.insert(static_cast<int>(I))) : void()), ...);
  return out;
}

// Every value of the enum's underlying type that names an enumerator has its
// row, and every row an enumerator: a dtype added to the enum but not to
// kDTypeTable fails here.
TEST(DType, EveryEnumeratorHasATableRow) {
  std::set<int> enumerators = Enumerators(std::make_index_sequence<256>());
  ASSERT_FALSE(enumerators.empty());
  std::set<int> rows;
  for (const DTypeInfo& info : kDTypeTable) rows.insert(static_cast<int>(info.dtype));
  EXPECT_EQ(enumerators, rows);
  EXPECT_EQ(static_cast<int>(rows.size()), kNumDTypes);
  EXPECT_TRUE(IsEnumerator<DType::kFloat8E5M2>());
  EXPECT_FALSE(IsEnumerator<static_cast<DType>(200)>());
}

TEST(DType, NamesRoundTripAndSizesArePositive) {
  std::set<std::string_view> names;
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    EXPECT_TRUE(IsValidDType(t));
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
    EXPECT_GT(DTypeSize(t), 0u);
    names.insert(DTypeName(t));
  }
  EXPECT_EQ(static_cast<int>(names.size()), kNumDTypes) << "names must be distinct";
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeName(DType::kFloat8E4M3), "float8_e4m3fn");
  EXPECT_FALSE(DTypeFromName("float128").has_value());
  const auto outside = static_cast<DType>(kNumDTypes);
  EXPECT_FALSE(IsValidDType(outside));
  EXPECT_EQ(DTypeSize(outside), 0u);
  EXPECT_EQ(DTypeName(outside), "invalid");
  EXPECT_FALSE(DTypeStoredAsRawBits(outside));
}

// The types the file format cannot hold exactly (docs/FORMAT.md) are stored
// as raw bits; the others are not.
TEST(DType, RawBitsAreExactlyBFloat16AndFloat8) {
  std::set<DType> raw;
  for (const DTypeInfo& info : kDTypeTable) {
    if (DTypeStoredAsRawBits(info.dtype)) raw.insert(info.dtype);
  }
  EXPECT_EQ(raw, (std::set<DType>{DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2}));
  EXPECT_EQ(GetDTypeInfo(DType::kFloat16).kind, DTypeKind::kIeeeFloat);
  EXPECT_EQ(GetDTypeInfo(DType::kBool).kind, DTypeKind::kBool);
}

}  // namespace
}  // namespace mhckpt
