// Element types (base/dtype.h) and boxes: the vocabulary shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/dtype.h"

namespace mhckpt {

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

/// The bytes of `box` with elements of `dtype`; 0 for a box whose volume is
/// invalid (Volume).
size_t BoxBytes(const Box& box, DType dtype);

/// Part `part` (0-based) of `n` rows cut into `parts` contiguous ranges of
/// near-equal length, in order, the first `n % parts` one row longer:
/// [begin, end). The one row split of the code base (sharding in tests, the
/// demo and the benchmarks; replica-parallel slices in the plan).
std::pair<int64_t, int64_t> SplitRange(int64_t n, int parts, int part);

/// The box covering the whole of `shape`.
Box FullBox(const std::vector<int64_t>& shape);

/// Why `box` is not a valid box of an array of `shape`, or an empty string.
/// Checks rank, negative values, and start + count <= shape without overflow.
std::string CheckBoxInShape(const Box& box, const std::vector<int64_t>& shape);

/// True if the two boxes (same rank, valid) share at least one element.
bool BoxesIntersect(const Box& a, const Box& b);

/// Most bytes of an array name, and most '/'-separated components in it.
inline constexpr size_t kMaxNameBytes = 1024;
inline constexpr size_t kMaxNameDepth = 64;
/// Most dimensions of an array (HDF5's limit, H5S_MAX_RANK).
inline constexpr size_t kMaxDims = 32;

/// Why `name` is not a safe array name, or an empty string. A name is a
/// '/'-separated path of at most kMaxNameDepth non-empty components, none "."
/// or "..", not absolute, printable ASCII only, at most kMaxNameBytes long.
std::string CheckArrayName(std::string_view name);

/// Why `text` is not valid UTF-8 (RFC 3629: no overlong forms, no
/// surrogates, nothing past U+10FFFF), naming the first bad byte and its
/// offset, or an empty string. What the JSON of the commit marker needs.
std::string CheckUtf8(std::string_view text);

/// `text` as an error message may quote it whatever it holds: bytes outside
/// printable ASCII as \xNN, cut after `max_bytes` with the full length said
/// ("abc...(5000 bytes)"). For names and keys that failed a check.
std::string QuoteForMessage(std::string_view text, size_t max_bytes = 80);

}  // namespace mhckpt
