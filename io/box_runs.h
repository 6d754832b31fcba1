// Where the bytes of a box lie in a data file that stores each array
// contiguously and row-major at a known offset (the direct engine's writes,
// the pread reader's reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/types.h"

namespace mhckpt::io {

/// Where an array's bytes lie in the file.
struct Placement {
  std::optional<uint64_t> offset;  ///< none: the array has no elements
  std::vector<int64_t> shape;
  size_t element = 0;  ///< bytes per element
};

/// One contiguous run of a box: `size` bytes at file offset `offset`, which
/// are bytes [at, at + size) of the box's own row-major buffer.
struct BoxRun {
  uint64_t offset = 0;
  size_t at = 0;
  size_t size = 0;
};

/// The contiguous runs of `box` (inside `p.shape`) in the array placed at
/// `p`, in the order of the box's own row-major bytes; runs adjacent both in
/// the file and in the buffer are joined. None for an empty box or an array
/// without a placement.
std::vector<BoxRun> BoxRuns(const Placement& p, const Box& box);

}  // namespace mhckpt::io
