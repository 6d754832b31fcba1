// The rank-local side of a save: check what the caller handed over and copy
// every box into host memory that mhckpt owns. After TakeSnapshot returns,
// nothing reads caller memory again.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/array.h"

namespace mhckpt {

/// A copied box: its place in the global array and its bytes in the staging
/// buffer of the snapshot.
struct StagedBox {
  Box box;
  size_t offset = 0;  ///< into Snapshot::bytes
  size_t size = 0;    ///< bytes
};

/// An array as this rank described it, with its copied boxes.
struct StagedArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<StagedBox> boxes;
};

/// Everything a rank contributes to one save.
struct Snapshot {
  std::vector<StagedArray> arrays;  ///< in the caller's order
  std::unique_ptr<std::byte[]> bytes;
  size_t total_bytes = 0;

  [[nodiscard]] const std::byte* data(const StagedBox& b) const { return bytes.get() + b.offset; }
};

/// Checks `arrays` locally (names, dtypes, boxes inside shapes, null
/// pointers, duplicates on this rank) and copies every valid box. On a bad
/// input it returns the error, naming the array, `rank` and the box; the
/// snapshot then still describes every array (without the bad boxes), so the
/// rank can take part in the next collective round carrying its error.
Status TakeSnapshot(std::span<const ArrayToSave> arrays, int rank, Snapshot* out);

}  // namespace mhckpt
