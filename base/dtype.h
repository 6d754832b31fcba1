// Element types: the one table from which every property of a dtype derives.
//
// Adding a dtype: an enumerator in `DType` and a row in `kDTypeTable` (in the
// same order), then the list in docs/FORMAT.md. The size, the name, the
// storage type in the file (io/h5_file.cc maps `DTypeKind` + size to an HDF5
// type) and whether a dtype attribute names it all come from that row.
// tests/dtype_test.cc fails if an enumerator has no row.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mhckpt {

/// Element type of an array. The numeric values are part of no format: the
/// file and the marker store the names (DTypeName).
enum class DType : uint8_t {
  kBool,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kFloat8E4M3,
  kFloat8E5M2,
};

/// How storage describes an element, in terms of no particular engine.
enum class DTypeKind : uint8_t {
  kBool,         ///< one byte, 0 or 1 (HDF5: h5py's int8 enum {FALSE, TRUE})
  kSignedInt,    ///< two's complement, little-endian
  kUnsignedInt,  ///< little-endian
  kIeeeFloat,    ///< IEEE 754 binary16/32/64 (by size), little-endian
  /// A type the storage has no exact type for (bfloat16, float8): stored as
  /// unsigned integers of the same size holding the raw bits, with an
  /// attribute naming the dtype, so no reader converts (and changes) values.
  kRawBits,
};

/// One row of the table.
struct DTypeInfo {
  DType dtype;
  std::string_view name;  ///< as numpy / ml_dtypes spell it
  size_t size;            ///< bytes per element
  DTypeKind kind;
};

/// Every dtype, indexed by its enum value.
inline constexpr std::array kDTypeTable = {
    DTypeInfo{DType::kBool, "bool", 1, DTypeKind::kBool},
    DTypeInfo{DType::kInt8, "int8", 1, DTypeKind::kSignedInt},
    DTypeInfo{DType::kInt16, "int16", 2, DTypeKind::kSignedInt},
    DTypeInfo{DType::kInt32, "int32", 4, DTypeKind::kSignedInt},
    DTypeInfo{DType::kInt64, "int64", 8, DTypeKind::kSignedInt},
    DTypeInfo{DType::kUInt8, "uint8", 1, DTypeKind::kUnsignedInt},
    DTypeInfo{DType::kUInt16, "uint16", 2, DTypeKind::kUnsignedInt},
    DTypeInfo{DType::kUInt32, "uint32", 4, DTypeKind::kUnsignedInt},
    DTypeInfo{DType::kUInt64, "uint64", 8, DTypeKind::kUnsignedInt},
    DTypeInfo{DType::kFloat16, "float16", 2, DTypeKind::kIeeeFloat},
    DTypeInfo{DType::kBFloat16, "bfloat16", 2, DTypeKind::kRawBits},
    DTypeInfo{DType::kFloat32, "float32", 4, DTypeKind::kIeeeFloat},
    DTypeInfo{DType::kFloat64, "float64", 8, DTypeKind::kIeeeFloat},
    DTypeInfo{DType::kFloat8E4M3, "float8_e4m3fn", 1, DTypeKind::kRawBits},
    DTypeInfo{DType::kFloat8E5M2, "float8_e5m2", 1, DTypeKind::kRawBits},
};

inline constexpr int kNumDTypes = static_cast<int>(kDTypeTable.size());

namespace internal {
constexpr bool TableIsInEnumOrder() {
  for (size_t i = 0; i < kDTypeTable.size(); ++i) {
    if (static_cast<size_t>(kDTypeTable[i].dtype) != i) return false;
  }
  return true;
}
}  // namespace internal
static_assert(internal::TableIsInEnumOrder(), "kDTypeTable rows must follow the DType enum");

/// True for a value inside the enum.
constexpr bool IsValidDType(DType dtype) { return static_cast<int>(dtype) < kNumDTypes; }

/// The row of `dtype`; `dtype` must be valid.
constexpr const DTypeInfo& GetDTypeInfo(DType dtype) {
  return kDTypeTable[static_cast<size_t>(dtype)];
}

/// Bytes per element; 0 for a value outside the enum.
constexpr size_t DTypeSize(DType dtype) {
  return IsValidDType(dtype) ? GetDTypeInfo(dtype).size : 0;
}

/// "float32", "bfloat16", ... (the names numpy / ml_dtypes use); "invalid"
/// for a value outside the enum.
constexpr std::string_view DTypeName(DType dtype) {
  return IsValidDType(dtype) ? GetDTypeInfo(dtype).name : "invalid";
}

/// True if `dtype` is stored as raw bits with an attribute naming it
/// (DTypeKind::kRawBits).
constexpr bool DTypeStoredAsRawBits(DType dtype) {
  return IsValidDType(dtype) && GetDTypeInfo(dtype).kind == DTypeKind::kRawBits;
}

/// Inverse of DTypeName.
constexpr std::optional<DType> DTypeFromName(std::string_view name) {
  for (const DTypeInfo& info : kDTypeTable) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

}  // namespace mhckpt
