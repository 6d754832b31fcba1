// The commit marker (docs/FORMAT.md): a JSON file whose presence and validity
// is the only proof that a step is committed. It also describes the step, so
// that restore, `mhckpt inspect` and `verify` need nothing else to plan.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace mhckpt::io {

inline constexpr int kFormatVersion = 1;
/// A marker larger than this is refused unread (a forged or damaged file).
inline constexpr size_t kMaxMarkerBytes = size_t{1} << 30;

struct MarkerBox {
  Box box;
  int writer = 0;         ///< the rank that wrote this box
  uint64_t checksum = 0;  ///< XXH3-64 of the box's bytes, row-major (base/checksum.h)
};

struct MarkerArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  /// Every holder had the whole array. Its boxes: the whole array, or (with
  /// replica-parallel saving) row slices of it, each by a different writer.
  bool replicated = false;
  std::vector<MarkerBox> boxes;
};

struct Marker {
  int format_version = kFormatVersion;
  int64_t step = 0;
  int world_size = 0;
  int64_t created_unix_ms = 0;
  std::string data_file = "data.h5";
  std::vector<MarkerArray> arrays;  ///< sorted by name
  std::map<std::string, std::string> user_metadata;
  uint64_t total_bytes = 0;  ///< bytes of array data in the step

  /// The array called `name`, or nullptr.
  [[nodiscard]] const MarkerArray* Find(const std::string& name) const;
};

/// JSON text of a marker.
std::string MarkerToJson(const Marker& marker);

/// Parses and validates a marker: syntax, version, names, dtypes, shapes
/// (non-negative, bounded volume), boxes inside shapes. Errors are DataLoss
/// and name `origin` (a path) and the offending array.
Result<Marker> ParseMarker(const std::string& json, const std::string& origin);

/// The checks ParseMarker makes of what it parsed (data file, version, names,
/// shapes, boxes, writers), for a marker built in memory.
Status CheckMarker(const Marker& marker, const std::string& origin);

/// Reads and parses `path`; NotFound if the file does not exist.
Result<Marker> ReadMarker(const std::string& path);

}  // namespace mhckpt::io
