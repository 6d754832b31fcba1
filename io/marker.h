// The commit marker (docs/FORMAT.md): a JSON file whose presence and validity
// is the only proof that a step is committed. It also describes the step, so
// that restore, `mhckpt inspect` and `verify` need nothing else to plan.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace mhckpt::io {

/// The version this build writes by default (Options::format_version); it
/// reads kOldestFormatVersion to it. Version 2 adds chunk checksums
/// (MarkerBox::chunks) and dataset offsets; version 3 moves every checksum
/// into the step's index file (io/step_index.h) and describes a regular
/// sharding as one grid, so the marker grows with the arrays, not the chunks.
inline constexpr int kFormatVersion = 3;
inline constexpr int kOldestFormatVersion = 1;
/// The chunk size a save aims at (Marker::chunk_bytes): a restore that reads
/// part of a stored box reads, and checks, the whole chunks around it
/// (docs/PERFORMANCE.md, "Checked restores", for how it was chosen).
inline constexpr uint64_t kChunkBytes = uint64_t{1} << 20;
/// A marker larger than this is refused unread (a forged or damaged file).
inline constexpr size_t kMaxMarkerBytes = size_t{1} << 30;

struct MarkerBox {
  Box box;
  int writer = 0;         ///< the rank that wrote this box
  uint64_t checksum = 0;  ///< XXH3-64 of the box's bytes, row-major (base/checksum.h)
  /// Version 2 and 3: the box cut along dimension 0 into chunks of
  /// `chunk_rows` rows (the last may be shorter; a 0-d box is one chunk), and
  /// the XXH3-64 of each chunk's bytes. Version 1: 0 and empty. Version 3:
  /// `checksum` and `chunks` are in the index, not the marker: zero and empty
  /// until read from it (io::LoadIndexRecords).
  int64_t chunk_rows = 0;
  std::vector<uint64_t> chunks;
  /// Version 3 with subfiles (Marker::files): the subfile that holds the
  /// box's bytes (io::SubfileName) and where they start in it, row-major
  /// over the box. In the index, not the marker: -1 until read from it.
  int64_t file = -1;
  int64_t file_offset = -1;
};

/// Where a box's bytes lie in a step with subfiles (Marker::files).
struct BoxPlace {
  uint64_t file = 0;    ///< the subfile (io::SubfileName)
  uint64_t offset = 0;  ///< of the box's first byte in it
};

struct MarkerArray {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  /// Every holder had the whole array. Its boxes: the whole array, or (with
  /// replica-parallel saving) row slices of it, each by a different writer.
  bool replicated = false;
  std::vector<MarkerBox> boxes;
  /// Version 2: where the array's bytes start in the data file (contiguous,
  /// row-major), or -1 (version 1, no bytes, or an engine without offsets).
  int64_t offset = -1;
};

/// Version 3: the step's index file (io/step_index.h), as the marker records it.
struct MarkerIndex {
  uint64_t bytes = 0;     ///< its exact size (io::IndexLayout::total)
  uint64_t checksum = 0;  ///< XXH3-64 of every record's check word, in order
};

/// A step saved at the preemption step that every rank agreed on
/// (CheckpointManager::ReachedPreemption). Optional in every version: a
/// reader that predates it ignores it, as it ignores every unknown key.
struct MarkerPreemption {
  int64_t notice_unix_ms = 0;  ///< the earliest rank's notice
  int64_t grace_ms = 0;        ///< the scheduler's grace period (0: unknown)
  int64_t saved_after_ms = 0;  ///< from the notice to the marker (created_unix_ms)
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
  uint64_t chunk_bytes = 0;  ///< version 2 and 3: the chunk size the save aimed at
  MarkerIndex index;         ///< version 3
  /// Version 3: 0, the array bytes are in `data_file`; else the step's
  /// subfiles (io::SubfileName), each written by one group of ranks, each
  /// box a dataset of its own, and `data_file` holds only virtual datasets
  /// that map every array onto them. Where each box lies is in the index
  /// (MarkerBox::file, file_offset).
  int files = 0;
  /// Set for a step saved because of a preemption notice.
  std::optional<MarkerPreemption> preemption;

  /// The array called `name`, or nullptr.
  [[nodiscard]] const MarkerArray* Find(const std::string& name) const;
};

/// Rows of `box` per chunk for a chunk size of `chunk_bytes`: as many whole
/// rows (dimension 0) as fit, at least one; 1 for a 0-d box.
int64_t ChunkRows(const Box& box, DType dtype, uint64_t chunk_bytes);
/// Chunks of `box` at `chunk_rows` rows each: 1 for a 0-d box.
int64_t ChunkCount(const Box& box, int64_t chunk_rows);
/// Sizes the chunks of every box of `marker` for `chunk_bytes` and makes it
/// `version` (2 or 3). Version 2: the chunk lists are zeros, to be filled by
/// the writers; version 3: they stay empty (the writers put them in the
/// index).
void PlanChunks(Marker* marker, uint64_t chunk_bytes, int version = kFormatVersion);

/// Version 3: the cuts of each dimension if the boxes of `a` are the cells of
/// a grid over its shape (every dimension cut at the same places for all
/// boxes), listed in row-major order of the cells; nullopt otherwise.
std::optional<std::vector<std::vector<int64_t>>> GridCuts(const MarkerArray& a);

/// What a marker's text is for.
enum class MarkerText : uint8_t {
  /// The commit marker: everything, chunk checksums included.
  kCommit,
  /// The plan that rank 0 broadcasts before the writes: without the boxes'
  /// chunk lists (`chunk_rows`, `chunks`), which are all zero then and which
  /// every rank sizes again from `chunk_bytes` (PlanChunks). At 1 MiB chunks
  /// they are most of the text: 8,000 ranks x 10,020 arrays of a 70B model,
  /// 86 MB with them and 6.6 MB without (docs/SCALE.md). Version 3 has no
  /// chunk lists in either text; its plan has no index.
  kPlan,
};

/// JSON text of a marker.
std::string MarkerToJson(const Marker& marker, MarkerText what = MarkerText::kCommit);

/// Parses and validates a marker: syntax, version, names, dtypes, shapes
/// (non-negative, bounded volume), boxes inside shapes. Errors are DataLoss
/// and name `origin` (a path) and the offending array. A kPlan text of
/// version 2 gets its chunk lists from PlanChunks (any in the text are
/// ignored).
Result<Marker> ParseMarker(const std::string& json, const std::string& origin,
                           MarkerText what = MarkerText::kCommit);

/// The checks ParseMarker makes of what it parsed (data file, version, names,
/// shapes, boxes, writers), for a marker built in memory.
Status CheckMarker(const Marker& marker, const std::string& origin);

/// Reads and parses `path`; NotFound if the file does not exist.
Result<Marker> ReadMarker(const std::string& path);

}  // namespace mhckpt::io
