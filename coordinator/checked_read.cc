#include "coordinator/checked_read.h"

#include <algorithm>
#include <cstring>

#include "base/checksum.h"
#include "coordinator/committed_step.h"
#include "coordinator/plan.h"

namespace mhckpt::internal {
namespace {

// A bounce buffer grows to hold this many bytes of chunks (or one chunk).
constexpr uint64_t kBounceBytes = uint64_t{64} << 20;

// The elements `a` and `b` share (they intersect).
Box Intersection(const Box& a, const Box& b) {
  Box r = a;
  for (size_t d = 0; d < a.start.size(); ++d) {
    r.start[d] = std::max(a.start[d], b.start[d]);
    r.count[d] = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]) - r.start[d];
  }
  return r;
}

// One stored box of an array, as the reads of `want` cut it into chunks.
class StoredBoxRead {
 public:
  StoredBoxRead(io::StepReader& reader, size_t handle, const io::MarkerArray& a,
                const io::MarkerBox& b, const Box& want, std::byte* out)
      : reader_(reader),
        handle_(handle),
        a_(a),
        b_(b),
        want_(want),
        out_(out),
        elem_(DTypeSize(a.dtype)),
        want_bytes_(static_cast<size_t>(Volume(want.count).value_or(0)) * elem_) {}

  // Reads and checks the chunks of the stored box that `want` needs.
  Status Run(std::vector<std::byte>& bounce, CheckedReadStats* stats) {
    if (b_.box.count.empty()) return ReadGroup(0, 1, out_, stats);  // 0-d: one chunk
    const int64_t count0 = b_.box.count[0];
    row_bytes_ = static_cast<size_t>(Volume(b_.box.count).value_or(0) / count0) * elem_;
    const int64_t r0 = std::max(want_.start[0], b_.box.start[0]) - b_.box.start[0];
    const int64_t r1 =
        std::min(want_.start[0] + want_.count[0], b_.box.start[0] + count0) - b_.box.start[0];
    const int64_t rows = b_.chunk_rows;
    const int64_t last = (r1 - 1) / rows + 1;
    for (int64_t c = r0 / rows; c < last;) {
      const bool direct = Direct(c);
      int64_t e = c + 1;
      if (direct) {
        while (e < last && Direct(e)) ++e;
      } else {
        while (e < last && !Direct(e) &&
               static_cast<uint64_t>(e + 1 - c) * static_cast<uint64_t>(rows) * row_bytes_ <=
                   kBounceBytes) {
          ++e;
        }
      }
      const Box group = Chunks(c, e);
      const size_t group_bytes = static_cast<size_t>(*Volume(group.count)) * elem_;
      if (direct) {
        MHCKPT_RETURN_IF_ERROR(
            ReadGroup(c, e, out_ + RowRunBytes(want_, group, want_bytes_)->first, stats));
      } else {
        if (bounce.size() < group_bytes) bounce.resize(group_bytes);
        MHCKPT_RETURN_IF_ERROR(ReadGroup(c, e, bounce.data(), stats));
        CopyRegion(bounce.data(), group, out_, want_, Intersection(group, want_), elem_);
      }
      c = e;
    }
    return OkStatus();
  }

 private:
  // Rows [first * chunk_rows, last * chunk_rows) of the stored box, clipped.
  [[nodiscard]] Box Chunks(int64_t first, int64_t last) const {
    Box box = b_.box;
    box.start[0] = b_.box.start[0] + first * b_.chunk_rows;
    box.count[0] = std::min(last * b_.chunk_rows, b_.box.count[0]) - first * b_.chunk_rows;
    return box;
  }

  // Chunk `c` lies whole in `want` as a run of its rows: read it in place.
  [[nodiscard]] bool Direct(int64_t c) const {
    return RowRunBytes(want_, Chunks(c, c + 1), want_bytes_).has_value();
  }

  // Reads chunks [first, last) into `dst` and checks each.
  Status ReadGroup(int64_t first, int64_t last, std::byte* dst, CheckedReadStats* stats) {
    const Box group = b_.box.count.empty() ? b_.box : Chunks(first, last);
    const size_t bytes = static_cast<size_t>(*Volume(group.count)) * elem_;
    MHCKPT_RETURN_IF_ERROR(reader_.Read(handle_, group, dst));
    const size_t chunk_bytes =
        b_.box.count.empty() ? bytes : static_cast<size_t>(b_.chunk_rows) * row_bytes_;
    for (int64_t c = first; c < last; ++c) {
      const size_t at = static_cast<size_t>(c - first) * chunk_bytes;
      MHCKPT_RETURN_IF_ERROR(
          CheckChunkChecksum(a_, b_, c, Checksum(dst + at, std::min(chunk_bytes, bytes - at))));
    }
    if (stats != nullptr) {
      stats->read += bytes;
      stats->checked += bytes;
    }
    return OkStatus();
  }

  io::StepReader& reader_;
  size_t handle_;
  const io::MarkerArray& a_;
  const io::MarkerBox& b_;
  const Box& want_;
  std::byte* out_;
  size_t elem_;
  size_t want_bytes_;
  size_t row_bytes_ = 0;
};

}  // namespace

Status ReadChecked(io::StepReader& reader, size_t handle, const io::MarkerArray& a, const Box& want,
                   std::byte* out, std::vector<std::byte>& bounce, CheckedReadStats* stats) {
  for (const io::MarkerBox& b : a.boxes) {
    if (Volume(b.box.count).value_or(0) == 0 || !BoxesIntersect(want, b.box)) continue;
    MHCKPT_RETURN_IF_ERROR(StoredBoxRead(reader, handle, a, b, want, out).Run(bounce, stats));
  }
  return OkStatus();
}

void CopyRegion(const std::byte* src, const Box& src_box, std::byte* dst, const Box& dst_box,
                const Box& region, size_t elem) {
  const size_t n = region.count.size();
  if (n == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  for (int64_t c : region.count) {
    if (c <= 0) return;
  }
  // The innermost dimensions that the region spans wholly in both boxes
  // join the run that one memcpy moves; dimension k is the run's outermost.
  size_t k = n - 1;
  while (k > 0 && region.count[k] == src_box.count[k] && region.count[k] == dst_box.count[k]) --k;
  std::vector<size_t> src_stride(n), dst_stride(n);
  size_t s = elem, t = elem;
  for (size_t d = n; d-- > 0;) {
    src_stride[d] = s;
    dst_stride[d] = t;
    s *= static_cast<size_t>(src_box.count[d]);
    t *= static_cast<size_t>(dst_box.count[d]);
  }
  const size_t run = static_cast<size_t>(region.count[k]) * src_stride[k];
  size_t src_at = 0, dst_at = 0;
  for (size_t d = 0; d < n; ++d) {
    src_at += static_cast<size_t>(region.start[d] - src_box.start[d]) * src_stride[d];
    dst_at += static_cast<size_t>(region.start[d] - dst_box.start[d]) * dst_stride[d];
  }
  // An odometer over the dimensions outside the run.
  std::vector<int64_t> index(k, 0);
  while (true) {
    std::memcpy(dst + dst_at, src + src_at, run);
    size_t d = k;
    for (; d-- > 0;) {
      if (++index[d] < region.count[d]) {
        src_at += src_stride[d];
        dst_at += dst_stride[d];
        break;
      }
      src_at -= static_cast<size_t>(region.count[d] - 1) * src_stride[d];
      dst_at -= static_cast<size_t>(region.count[d] - 1) * dst_stride[d];
      index[d] = 0;
    }
    if (d == static_cast<size_t>(-1)) return;
  }
}

}  // namespace mhckpt::internal
