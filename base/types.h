// Element types and boxes: the vocabulary shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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
inline constexpr int kNumDTypes = 15;

/// Bytes per element; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);
/// "float32", "bfloat16", ... (the names numpy / ml_dtypes use).
std::string_view DTypeName(DType dtype);
/// Inverse of DTypeName.
std::optional<DType> DTypeFromName(std::string_view name);
/// True for a value inside the enum.
bool IsValidDType(DType dtype);

/// A hyperslab of a global array: `count[d]` elements from `start[d]` in each
/// dimension. A 0-d array has one box with empty vectors (one element).
struct Box {
  std::vector<int64_t> start;
  std::vector<int64_t> count;

  friend bool operator==(const Box& a, const Box& b) {
    return a.start == b.start && a.count == b.count;
  }
  friend bool operator<(const Box& a, const Box& b) {
    return a.start != b.start ? a.start < b.start : a.count < b.count;
  }
};

/// "[0:5, 3:7]" (half-open ranges), "[]" for a 0-d box.
std::string BoxToString(const Box& box);
/// "[1001, 7]".
std::string ShapeToString(const std::vector<int64_t>& shape);

/// The number of elements of `shape` (1 for 0-d), or nullopt on a negative
/// extent or an overflow past 2^62.
std::optional<int64_t> Volume(const std::vector<int64_t>& shape);

/// The box covering the whole of `shape`.
Box FullBox(const std::vector<int64_t>& shape);

/// Why `box` is not a valid box of an array of `shape`, or an empty string.
/// Checks rank, negative values, and start + count <= shape without overflow.
std::string CheckBoxInShape(const Box& box, const std::vector<int64_t>& shape);

/// True if the two boxes (same rank, valid) share at least one element.
bool BoxesIntersect(const Box& a, const Box& b);

/// Why `name` is not a safe array name, or an empty string. A name is a
/// '/'-separated path of non-empty components, none "." or "..", not
/// absolute, printable ASCII only.
std::string CheckArrayName(std::string_view name);

}  // namespace mhckpt
