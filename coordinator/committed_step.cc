#include "coordinator/committed_step.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/checksum.h"
#include "coordinator/agree.h"
#include "coordinator/root_upkeep.h"

namespace mhckpt::internal {

Result<io::Marker> ReadMarkerEverywhere(const Comm& comm, io::RootStore& store, int64_t step) {
  Status s;
  std::string text;
  if (comm.rank() == 0) {
    Result<std::string> r = store.GetMarker(step);
    if (r.ok()) {
      text = std::move(r).value();
    } else if (r.status().code() == StatusCode::kNotFound) {
      s = NotFound(fmt::format("step {} is not committed in '{}'", step, store.root()));
    } else {
      s = Status(r.status().code(), fmt::format("rank 0: read the commit marker of step {}: {}",
                                                step, r.status().message()));
    }
  }
  MHCKPT_RETURN_IF_ERROR(ShareText(comm, 0, s, &text));
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, io::ParseMarker(text, store.MarkerLocation(step)));
  MHCKPT_RETURN_IF_ERROR(CheckMarkerStep(m, store, step));
  return m;
}

Status CheckMarkerStep(const io::Marker& m, const io::RootStore& store, int64_t step) {
  if (m.step == step) return OkStatus();
  return DataLoss(
      fmt::format("commit marker '{}' says step {}", store.MarkerLocation(step), m.step));
}

io::ArraySpec StoredSpec(const io::MarkerArray& a) {
  return {a.name, a.dtype, a.shape, a.offset, -1, {}};
}

bool ReadableByOffset(const io::MarkerArray& a) {
  return a.offset >= 0 || Volume(a.shape).value_or(0) == 0;
}

Status CheckChecksum(const io::MarkerArray& a, const io::MarkerBox& b, uint64_t actual) {
  if (actual == b.checksum) return OkStatus();
  return DataLoss(fmt::format(
      "array '{}' box {}: checksum mismatch: the marker says {}, the file holds {} (written by "
      "rank {})",
      a.name, BoxToString(b.box), ChecksumToString(b.checksum), ChecksumToString(actual),
      b.writer));
}

Status CheckChunkChecksum(const io::MarkerArray& a, const io::MarkerBox& b, int64_t chunk,
                          uint64_t actual) {
  const uint64_t expected = b.chunks[static_cast<size_t>(chunk)];
  if (actual == expected) return OkStatus();
  std::string rows;
  if (!b.box.count.empty()) {
    const int64_t first = b.box.start[0] + chunk * b.chunk_rows;
    const int64_t end = std::min(first + b.chunk_rows, b.box.start[0] + b.box.count[0]);
    rows = fmt::format(" (rows {}..{})", first, end);
  }
  return DataLoss(fmt::format(
      "array '{}' box {} chunk {}{}: checksum mismatch: the marker says {}, the file holds {} "
      "(written by rank {})",
      a.name, BoxToString(b.box), chunk, rows, ChecksumToString(expected), ChecksumToString(actual),
      b.writer));
}

Status CheckChunks(const io::MarkerArray& a, const io::MarkerBox& b, const Box& rows,
                   const std::byte* data) {
  const size_t bytes = BoxBytes(rows, a.dtype);
  int64_t chunk = 0;
  size_t chunk_bytes = bytes;
  if (!b.box.count.empty()) {
    chunk = (rows.start[0] - b.box.start[0]) / b.chunk_rows;
    const size_t row_bytes = BoxBytes(b.box, a.dtype) / static_cast<size_t>(b.box.count[0]);
    chunk_bytes = static_cast<size_t>(b.chunk_rows) * row_bytes;
  }
  for (size_t at = 0; at < bytes; at += chunk_bytes, ++chunk) {
    MHCKPT_RETURN_IF_ERROR(
        CheckChunkChecksum(a, b, chunk, Checksum(data + at, std::min(chunk_bytes, bytes - at))));
  }
  return OkStatus();
}

}  // namespace mhckpt::internal
