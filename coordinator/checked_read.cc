#include "coordinator/checked_read.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/committed_step.h"
#include "coordinator/plan.h"

namespace mhckpt::internal {
namespace {

// Rows [first * chunk_rows, last * chunk_rows) of stored box `b`, clipped.
Box Chunks(const io::MarkerBox& b, int64_t first, int64_t last) {
  Box box = b.box;
  box.start[0] = b.box.start[0] + first * b.chunk_rows;
  box.count[0] = std::min(last * b.chunk_rows, b.box.count[0]) - first * b.chunk_rows;
  return box;
}

// Checks every stored box of `a` whose bytes all lie, contiguously, in the
// `bytes` read for `box` at `host`: the box itself, or a run of whole rows of
// it (row shards, or the slices of replica-parallel saving, read whole). A
// read of part of a stored box cannot be checked against its checksum.
Status CheckStoredBoxes(const io::MarkerArray& a, const Box& box, const std::byte* host,
                        size_t bytes) {
  for (const io::MarkerBox& b : a.boxes) {
    if (b.box == box) {
      MHCKPT_RETURN_IF_ERROR(CheckChecksum(a, b, Checksum(host, bytes)));
    } else if (auto run = RowRunBytes(box, b.box, bytes)) {
      MHCKPT_RETURN_IF_ERROR(CheckChecksum(a, b, Checksum(host + run->first, run->second)));
    }
  }
  return OkStatus();
}

}  // namespace

Status ReadBatch::Add(size_t handle, const io::MarkerArray& a, const Box& want, std::byte* out) {
  if ((!verify_ || version_ < 2) && !subfiles()) {
    items_.push_back({});
    Item& it = items_.back();
    it.handle = handle;
    it.a = &a;
    it.box = want;
    it.dst = out;
    it.whole_boxes = verify_;
    return OkStatus();
  }
  for (const io::MarkerBox& b : a.boxes) {
    if (Volume(b.box.count).value_or(0) == 0 || !BoxesIntersect(want, b.box)) continue;
    MHCKPT_RETURN_IF_ERROR(AddStoredBox(handle, a, b, want, out));
  }
  return OkStatus();
}

// Queues the chunks of stored box `b` that `want` needs: runs of chunks that
// lie whole in `want` straight into `out`, the others in groups of at most
// kBounceBytes into bounce memory (flushing the batch when it is full).
Status ReadBatch::AddStoredBox(size_t handle, const io::MarkerArray& a, const io::MarkerBox& b,
                               const Box& want, std::byte* out) {
  const size_t want_bytes = BoxBytes(want, a.dtype);
  auto queue = [&](const Box& group, std::byte* dst) {
    const size_t group_bytes = BoxBytes(group, a.dtype);
    if (dst == nullptr && bounce_bytes_ > 0 && bounce_bytes_ + group_bytes > kBounceBytes) {
      MHCKPT_RETURN_IF_ERROR(Flush());
    }
    items_.push_back({});
    Item& it = items_.back();
    it.handle = handle;
    it.a = &a;
    it.box = group;
    it.stored = &b;
    if (dst != nullptr) {
      it.dst = dst;
      return OkStatus();
    }
    it.bounce_at = bounce_bytes_;
    bounce_bytes_ += group_bytes;
    it.bounced = true;
    it.want = want;
    it.out = out;
    return OkStatus();
  };
  if (b.box.count.empty()) return queue(b.box, out);  // 0-d: one chunk, in place
  const size_t row_bytes = BoxBytes(b.box, a.dtype) / static_cast<size_t>(b.box.count[0]);
  const int64_t r0 = std::max(want.start[0], b.box.start[0]) - b.box.start[0];
  const int64_t r1 =
      std::min(want.start[0] + want.count[0], b.box.start[0] + b.box.count[0]) - b.box.start[0];
  const int64_t rows = b.chunk_rows;
  const int64_t last = (r1 - 1) / rows + 1;
  auto direct = [&](int64_t c) {  // chunk c lies whole in `want` as a run of its rows
    return RowRunBytes(want, Chunks(b, c, c + 1), want_bytes).has_value();
  };
  for (int64_t c = r0 / rows; c < last;) {
    const bool in_place = direct(c);
    int64_t e = c + 1;
    const uint64_t limit = in_place ? kGroupBytes : kBounceBytes;
    while (e < last && direct(e) == in_place &&
           static_cast<uint64_t>(e + 1 - c) * static_cast<uint64_t>(rows) * row_bytes <= limit) {
      ++e;
    }
    const Box group = Chunks(b, c, e);
    MHCKPT_RETURN_IF_ERROR(
        queue(group, in_place ? out + RowRunBytes(want, group, want_bytes)->first : nullptr));
    c = e;
  }
  return OkStatus();
}

Status IndexSource::Load(
    std::span<const std::pair<const io::MarkerArray*, const io::MarkerBox*>> boxes) {
  std::vector<io::BoxRef> refs;
  for (const auto& [a, b] : boxes) {
    if (!b->chunks.empty()) continue;
    const auto ai = static_cast<uint32_t>(a - m_->arrays.data());
    refs.emplace_back(ai, static_cast<uint32_t>(b - a->boxes.data()));
  }
  if (refs.empty()) return OkStatus();
  if (!layout_) {
    MHCKPT_ASSIGN_OR_RETURN(io::IndexLayout layout, io::IndexLayout::Of(*m_, path_));
    layout_ = std::move(layout);
  }
  for (const io::BoxRef& r : refs) records_ += layout_->record_bytes(r.first, r.second);
  return io::LoadIndexRecords(path_, *layout_, refs, m_);
}

Status ReadBatch::Flush() {
  if (items_.empty()) return OkStatus();
  if (index_ != nullptr) {
    std::vector<std::pair<const io::MarkerArray*, const io::MarkerBox*>> stored;
    for (const Item& it : items_) {
      if (it.stored != nullptr) stored.emplace_back(it.a, it.stored);
    }
    Status loaded = index_->Load(stored);
    if (!loaded.ok()) {
      items_.clear();
      bounce_bytes_ = 0;
      return loaded;
    }
  }
  if (bounce_.size() < bounce_bytes_) bounce_.resize(bounce_bytes_);
  std::vector<io::ReadRequest> requests;
  requests.reserve(items_.size());
  // Each item is checked (and copied out) by the reader as soon as its bytes
  // are in (ReadRequest::on_read), on the thread that read them, while the
  // other reads go on; its outcome goes in its own slot.
  std::vector<Status> finished(items_.size());
  std::vector<char> ran(items_.size(), 0);
  Status s;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& it = items_[i];
    auto* data = it.bounced ? bounce_.data() + it.bounce_at : it.dst;
    if (!subfiles()) {
      requests.push_back({it.handle, it.box, data});
    } else {
      Result<io::ReadRequest> r = InSubfile(it, data);
      if (!r.ok()) {
        s = r.status();
        break;
      }
      requests.push_back(*r);
    }
    requests.back().on_read = [this, i, data, &finished, &ran] {
      // On a reader's thread: no exception may leave it.
      finished[i] = Guarded("check of a read", [&] { return Finish(items_[i], data); });
      ran[i] = 1;
      return finished[i];
    };
  }
  if (s.ok()) s = reader_.ReadMany(requests);
  // A read error comes first; then the first failed check in the order
  // queued, as if each item were checked after every read. An item the
  // reader did not hand back (no on_read support) is checked here.
  for (size_t i = 0; s.ok() && i < items_.size(); ++i) {
    s = ran[i] ? finished[i] : Finish(items_[i], static_cast<std::byte*>(requests[i].data));
  }
  if (s.ok() && stats_ != nullptr) {
    for (const Item& it : items_) {
      if (it.stored == nullptr) continue;
      const size_t bytes = BoxBytes(it.box, it.a->dtype);
      stats_->read += bytes;
      stats_->checked += bytes;
    }
  }
  items_.clear();
  bounce_bytes_ = 0;
  return s;
}

// The checks and the copy that follow the read of `item` into `dst`. Runs on
// any of the reader's threads, several at once for different items: it
// touches nothing but the item's own bytes and its destination's part.
Status ReadBatch::Finish(const Item& item, std::byte* dst) const {
  const io::MarkerArray& a = *item.a;
  const size_t bytes = BoxBytes(item.box, a.dtype);
  if (item.whole_boxes) MHCKPT_RETURN_IF_ERROR(CheckStoredBoxes(a, item.box, dst, bytes));
  if (item.stored == nullptr) return OkStatus();
  if (verify_) MHCKPT_RETURN_IF_ERROR(CheckChunks(a, *item.stored, item.box, dst));
  if (item.bounced) {
    CopyRegion(dst, item.box, item.out, item.want, Intersection(item.box, item.want),
               DTypeSize(a.dtype));
  }
  return OkStatus();
}

Result<io::ReadRequest> ReadBatch::InSubfile(const Item& item, void* data) {
  const io::MarkerBox& b = *item.stored;
  auto [it, fresh] = box_handles_.try_emplace(&b, 0);
  if (fresh) {
    const io::MarkerArray& a = *item.a;
    io::ArraySpec spec{a.name, a.dtype, b.box.count, b.file_offset, -1, {}};
    Result<size_t> h = reader_.OpenBox(spec, b.file);
    if (!h.ok()) {
      box_handles_.erase(it);
      return DataLoss(fmt::format("array '{}' box {} (written by rank {}): {}", a.name,
                                  BoxToString(b.box), b.writer, h.status().message()));
    }
    it->second = *h;
  }
  Box local = item.box;
  for (size_t d = 0; d < local.start.size(); ++d) local.start[d] -= b.box.start[d];
  return io::ReadRequest{it->second, std::move(local), data, nullptr};
}

Box Intersection(const Box& a, const Box& b) {
  Box r = a;
  for (size_t d = 0; d < a.start.size(); ++d) {
    r.start[d] = std::max(a.start[d], b.start[d]);
    r.count[d] = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]) - r.start[d];
  }
  return r;
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
