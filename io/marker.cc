#include "io/marker.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "base/checksum.h"
#include "io/layout.h"
#include "io/marker_slots.h"
#include "io/posix_file.h"
#include "io/step_index.h"

// The marker's JSON text is written in io/marker_json.cc and read into
// fields (MarkerSlots) in io/marker_sax.cc; here those fields become a
// Marker, which is checked (Validate).
namespace mhckpt::io {
namespace {

using marker_internal::ArraySlots;
using marker_internal::BoxSlots;
using marker_internal::Malformed;
using marker_internal::MarkerSlots;
using marker_internal::Need;
using marker_internal::NeedInt;
using marker_internal::ReadMarkerSlots;
using marker_internal::Slot;
using marker_internal::SlotState;

Status Validate(const Marker& m, const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return DataLoss(fmt::format("commit marker '{}': {}", origin, what));
  };
  if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion) {
    return bad(fmt::format("unknown format version {} (this build reads {} to {})",
                           m.format_version, kOldestFormatVersion, kFormatVersion));
  }
  const bool chunked = m.format_version >= 2;
  if (chunked && m.chunk_bytes == 0) return bad("chunk size 0");
  if (m.step < 0) return bad(fmt::format("negative step {}", m.step));
  if (m.world_size < 1) return bad(fmt::format("world size {} is not positive", m.world_size));
  if (m.files < 0 || m.files > m.world_size || (m.files > 0 && m.format_version < 3)) {
    return bad(fmt::format("{} subfiles for a world of {} ranks at format version {}", m.files,
                           m.world_size, m.format_version));
  }
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const MarkerArray& a = m.arrays[i];
    if (std::string why = CheckArrayName(a.name); !why.empty()) {
      return bad(fmt::format("array '{}': bad name: {}", QuoteForMessage(a.name), why));
    }
    if (i > 0 && !(m.arrays[i - 1].name < a.name)) {
      return bad(fmt::format("array '{}': arrays are not sorted and unique", a.name));
    }
    if (a.shape.size() > 32) return bad(fmt::format("array '{}': more than 32 dimensions", a.name));
    if (!Volume(a.shape)) {
      return bad(fmt::format("array '{}': invalid shape {}", a.name, ShapeToString(a.shape)));
    }
    for (const MarkerBox& b : a.boxes) {
      if (std::string why = CheckBoxInShape(b.box, a.shape); !why.empty()) {
        return bad(fmt::format("array '{}' box {}: {}", a.name, BoxToString(b.box), why));
      }
      if (b.writer < 0 || b.writer >= m.world_size) {
        return bad(fmt::format("array '{}' box {}: writer rank {} outside world size {}", a.name,
                               BoxToString(b.box), b.writer, m.world_size));
      }
      // Version 3 keeps the chunk lists in the index: empty until read.
      const bool unread = m.format_version >= 3 && b.chunks.empty();
      if (chunked && (b.chunk_rows < 1 ||
                      (!unread && b.chunks.size() !=
                                      static_cast<uint64_t>(ChunkCount(b.box, b.chunk_rows))))) {
        return bad(
            fmt::format("array '{}' box {}: {} chunk checksums of {} rows each do not "
                        "cover it",
                        a.name, BoxToString(b.box), b.chunks.size(), b.chunk_rows));
      }
    }
    if (chunked && a.offset < -1) {
      return bad(fmt::format("array '{}': negative file offset {}", a.name, a.offset));
    }
  }
  return OkStatus();
}

}  // namespace

int64_t ChunkRows(const Box& box, DType dtype, uint64_t chunk_bytes) {
  if (box.count.empty() || box.count[0] <= 0) return 1;
  const uint64_t row_bytes =
      static_cast<uint64_t>(Volume(box.count).value_or(0) / box.count[0]) * DTypeSize(dtype);
  if (row_bytes == 0) return box.count[0];
  return std::max<int64_t>(1, static_cast<int64_t>(std::min<uint64_t>(
                                  chunk_bytes / row_bytes, static_cast<uint64_t>(box.count[0]))));
}

int64_t ChunkCount(const Box& box, int64_t chunk_rows) {
  if (box.count.empty()) return 1;
  if (chunk_rows < 1 || box.count[0] <= 0) return 0;
  return (box.count[0] - 1) / chunk_rows + 1;
}

void PlanChunks(Marker* marker, uint64_t chunk_bytes, int version) {
  marker->format_version = version;
  marker->chunk_bytes = chunk_bytes;
  for (MarkerArray& a : marker->arrays) {
    for (MarkerBox& b : a.boxes) {
      b.chunk_rows = ChunkRows(b.box, a.dtype, chunk_bytes);
      if (version >= 3) {
        b.chunks.clear();
      } else {
        b.chunks.assign(static_cast<size_t>(ChunkCount(b.box, b.chunk_rows)), 0);
      }
    }
  }
}

std::optional<std::vector<std::vector<int64_t>>> GridCuts(const MarkerArray& a) {
  if (a.boxes.empty()) return std::nullopt;
  const size_t dims = a.shape.size();
  std::vector<std::vector<int64_t>> cuts(dims);
  for (size_t d = 0; d < dims; ++d) {
    for (const MarkerBox& b : a.boxes) cuts[d].push_back(b.box.start[d]);
    cuts[d].push_back(a.shape[d]);
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    if (cuts[d].front() != 0) return std::nullopt;
  }
  // Cell k, in row-major order, must be box k.
  std::vector<size_t> cell(dims, 0);
  bool all_cells = false;  // the last cell was matched
  for (const MarkerBox& b : a.boxes) {
    if (all_cells) return std::nullopt;  // more boxes than cells
    for (size_t d = 0; d < dims; ++d) {
      if (cell[d] + 1 >= cuts[d].size() || b.box.start[d] != cuts[d][cell[d]] ||
          b.box.count[d] != cuts[d][cell[d] + 1] - cuts[d][cell[d]]) {
        return std::nullopt;
      }
    }
    size_t d = dims;
    while (d > 0 && ++cell[d - 1] + 1 >= cuts[d - 1].size()) cell[--d] = 0;
    all_cells = d == 0;
  }
  if (!all_cells) return std::nullopt;
  return cuts;
}

const MarkerArray* Marker::Find(const std::string& name) const {
  auto it = std::lower_bound(arrays.begin(), arrays.end(), name,
                             [](const MarkerArray& a, const std::string& n) { return a.name < n; });
  return it != arrays.end() && it->name == name ? &*it : nullptr;
}

namespace {

// The chunk fields of a version-2 box.
Status ParseChunks(BoxSlots& sb, const std::string& origin, const std::string& array,
                   MarkerBox* box) {
  box->chunk_rows = NeedInt<int64_t>(sb.chunk_rows, "chunk_rows");
  const std::vector<std::string>& sums = Need(sb.chunks, "chunks");
  box->chunks.reserve(sums.size());
  for (const std::string& sum : sums) {
    auto checksum = ChecksumFromString(sum);
    if (!checksum) {
      return DataLoss(fmt::format("commit marker '{}': array '{}': bad chunk checksum '{}'", origin,
                                  array, sum));
    }
    box->chunks.push_back(*checksum);
  }
  return OkStatus();
}

// Version 3: the boxes of an array, listed or as a grid of writers.
Status ParseBoxesV3(ArraySlots& sa, const std::string& origin, MarkerArray* a) {
  auto bad = [&](const std::string& why) {
    return DataLoss(fmt::format("commit marker '{}': array '{}': {}", origin, a->name, why));
  };
  if (!Volume(a->shape)) return bad(fmt::format("invalid shape {}", ShapeToString(a->shape)));
  if (sa.boxes.state != SlotState::kMissing) {
    a->boxes.reserve(Need(sa.boxes, "boxes").size());
    for (BoxSlots& sb : sa.boxes.value) {
      Need(sb.start, "start");
      Need(sb.count, "count");
      a->boxes.push_back(MarkerBox{Box{std::move(sb.start.value), std::move(sb.count.value)},
                                   NeedInt<int>(sb.writer, "writer"),
                                   0,
                                   0,
                                   {}});
    }
    return OkStatus();
  }
  const std::vector<Slot<std::vector<int64_t>>>& grid = Need(sa.grid, "grid");
  const std::vector<int64_t>& writers = Need(sa.writers, "writers");
  if (grid.size() != a->shape.size()) {
    return bad(
        fmt::format("a grid of {} dimensions for a shape of {}", grid.size(), a->shape.size()));
  }
  // Every dimension's cuts go from 0 to its extent, strictly rising; the
  // cells, counted without overflow, are exactly the writers.
  uint64_t cells = 1;
  for (size_t d = 0; d < grid.size(); ++d) {
    const std::vector<int64_t>& cuts = Need(grid[d], "grid");
    bool rising = cuts.size() >= 2 && cuts.front() == 0 && cuts.back() == a->shape[d];
    for (size_t i = 1; rising && i < cuts.size(); ++i) rising = cuts[i - 1] < cuts[i];
    if (!rising) {
      return bad(
          fmt::format("the grid's cuts of dimension {} do not rise from 0 to {}", d, a->shape[d]));
    }
    if (__builtin_mul_overflow(cells, cuts.size() - 1, &cells) || cells > writers.size()) {
      return bad(fmt::format("a grid of more cells than its {} writers", writers.size()));
    }
  }
  if (cells != writers.size()) {
    return bad(fmt::format("a grid of {} cells with {} writers", cells, writers.size()));
  }
  a->boxes.resize(writers.size());
  std::vector<size_t> cell(grid.size(), 0);
  for (size_t k = 0; k < writers.size(); ++k) {
    MarkerBox& b = a->boxes[k];
    if (writers[k] < 0 || writers[k] > std::numeric_limits<int>::max()) {
      return bad(fmt::format("writer {} out of range", writers[k]));
    }
    b.writer = static_cast<int>(writers[k]);
    b.box.start.resize(grid.size());
    b.box.count.resize(grid.size());
    for (size_t d = 0; d < grid.size(); ++d) {
      b.box.start[d] = grid[d].value[cell[d]];
      b.box.count[d] = grid[d].value[cell[d] + 1] - b.box.start[d];
    }
    for (size_t d = grid.size(); d > 0 && ++cell[d - 1] + 1 >= grid[d - 1].value.size(); --d) {
      cell[d - 1] = 0;
    }
  }
  return OkStatus();
}

}  // namespace

Result<Marker> ParseMarker(const std::string& text, const std::string& origin, MarkerText what) {
  auto malformed = [&](const std::string& why) {
    return DataLoss(fmt::format("commit marker '{}' is malformed: {}", origin, why));
  };
  MarkerSlots s;
  if (std::string error; !ReadMarkerSlots(text, &s, &error)) return malformed(error);
  Marker m;
  try {
    if (!s.is_object) throw Malformed{"not a JSON object"};
    if (Need(s.format, "format") != "mhckpt") {
      return DataLoss(fmt::format("commit marker '{}': not an mhckpt marker", origin));
    }
    m.format_version = NeedInt<int>(s.format_version, "format_version");
    if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion) {
      return Validate(m, origin);
    }
    const bool chunked = m.format_version >= 2;
    if (chunked) m.chunk_bytes = NeedInt<uint64_t>(s.chunk_bytes, "chunk_bytes");
    m.step = NeedInt<int64_t>(s.step, "step");
    m.world_size = NeedInt<int>(s.world_size, "world_size");
    m.created_unix_ms = NeedInt<int64_t>(s.created_unix_ms, "created_unix_ms");
    m.data_file = Need(s.data_file, "data_file");
    m.total_bytes = NeedInt<uint64_t>(s.total_bytes, "total_bytes");
    m.user_metadata = std::move(s.user_metadata.value);
    Need(s.user_metadata, "user_metadata");
    const bool indexed = m.format_version >= 3;
    if (indexed && s.files.state != SlotState::kMissing) m.files = NeedInt<int>(s.files, "files");
    if (indexed && what == MarkerText::kCommit) {
      Need(s.index, "index");
      if (Need(s.index_file, "index.file") != kIndexFileName) {
        return DataLoss(fmt::format("commit marker '{}': unexpected index file '{}'", origin,
                                    s.index_file.value));
      }
      m.index.bytes = NeedInt<uint64_t>(s.index_bytes, "index.bytes");
      const std::string& sum = Need(s.index_checksum, "index.checksum");
      auto checksum = ChecksumFromString(sum);
      if (!checksum) {
        return DataLoss(fmt::format("commit marker '{}': bad index checksum '{}'", origin, sum));
      }
      m.index.checksum = *checksum;
    }
    if (s.preemption.state != SlotState::kMissing) {
      Need(s.preemption, "preemption");
      MarkerPreemption& p = m.preemption.emplace();
      p.notice_unix_ms = NeedInt<int64_t>(s.preemption_notice_unix_ms, "preemption.notice_unix_ms");
      p.grace_ms = NeedInt<int64_t>(s.preemption_grace_ms, "preemption.grace_ms");
      p.saved_after_ms = NeedInt<int64_t>(s.preemption_saved_after_ms, "preemption.saved_after_ms");
      if (p.grace_ms < 0) throw Malformed{"field 'preemption.grace_ms' is negative"};
    }
    m.arrays.reserve(Need(s.arrays, "arrays").size());
    for (ArraySlots& sa : s.arrays.value) {
      MarkerArray a;
      a.name = Need(sa.name, "name");
      const std::string& dtype_name = Need(sa.dtype, "dtype");
      auto dtype = DTypeFromName(dtype_name);
      if (!dtype) {
        return DataLoss(fmt::format("commit marker '{}': array '{}': unknown dtype '{}'", origin,
                                    a.name, dtype_name));
      }
      a.dtype = *dtype;
      a.shape = std::move(sa.shape.value);
      Need(sa.shape, "shape");
      a.replicated = Need(sa.replicated, "replicated");
      if (chunked) a.offset = NeedInt<int64_t>(sa.offset, "offset");
      if (indexed) {
        MHCKPT_RETURN_IF_ERROR(ParseBoxesV3(sa, origin, &a));
        m.arrays.push_back(std::move(a));
        continue;
      }
      a.boxes.reserve(Need(sa.boxes, "boxes").size());
      for (BoxSlots& sb : sa.boxes.value) {
        const std::string& sum = Need(sb.checksum, "checksum");
        auto checksum = ChecksumFromString(sum);
        if (!checksum) {
          return DataLoss(fmt::format("commit marker '{}': array '{}': bad checksum '{}'", origin,
                                      a.name, sum));
        }
        Need(sb.start, "start");
        Need(sb.count, "count");
        a.boxes.push_back(MarkerBox{Box{std::move(sb.start.value), std::move(sb.count.value)},
                                    NeedInt<int>(sb.writer, "writer"),
                                    *checksum,
                                    0,
                                    {}});
        if (chunked && what == MarkerText::kCommit) {
          MHCKPT_RETURN_IF_ERROR(ParseChunks(sb, origin, a.name, &a.boxes.back()));
        }
      }
      m.arrays.push_back(std::move(a));
    }
  } catch (const Malformed& e) {
    return malformed(e.why);
  }
  // A plan's chunks are sized here, as rank 0 sized them (Validate refuses
  // a chunk size of 0).
  // Version 3 sizes every box's chunks here (the chunk lists are in the
  // index).
  if ((what == MarkerText::kPlan || m.format_version >= 3) && m.format_version >= 2 &&
      m.chunk_bytes > 0) {
    PlanChunks(&m, m.chunk_bytes, m.format_version);
  }
  MHCKPT_RETURN_IF_ERROR(CheckMarker(m, origin));
  if (m.format_version >= 3 && what == MarkerText::kCommit) {
    MHCKPT_ASSIGN_OR_RETURN(IndexLayout layout, IndexLayout::Of(m, origin));
    if (layout.total() != m.index.bytes) {
      return DataLoss(
          fmt::format("commit marker '{}': the index is {} bytes, but its boxes' records take {}",
                      origin, m.index.bytes, layout.total()));
    }
  }
  return m;
}

Status CheckMarker(const Marker& m, const std::string& origin) {
  if (m.data_file != kDataFileName) {
    return DataLoss(
        fmt::format("commit marker '{}': unexpected data file '{}'", origin, m.data_file));
  }
  return Validate(m, origin);
}

Result<Marker> ReadMarker(const std::string& path) {
  MHCKPT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxMarkerBytes));
  return ParseMarker(text, path);
}

}  // namespace mhckpt::io
