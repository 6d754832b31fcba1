// Steps 3, 4 and 6 of the restore from the local tier (coordinator/
// local_restore.cc), LocalRestoreRun's serving side, run by every rank on its
// I/O thread for the pieces of one round:
//   3. Serve: each rank maps the writer files of its node read-only (or uses
//      a file rebuilt from parity in its memory), checks the chunks of the
//      stored box that a piece overlaps against the marker, once each, then
//      copies the piece into its own destination, or packs it for its asker;
//      a piece whose bytes are one run on both sides is sent as it is, or,
//      when it is its own, checked while it is copied (CopyChecked). A
//      piece it cannot serve is recorded for step 5, not an error.
//   4. Exchange: the direct pieces, in piece order, then one packed message
//      per pair of ranks; each asker copies its packed pieces out in the
//      same order.
//   6. Device destinations are filled from their host copies.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/local_restore_run.h"
#include "worker/copy.h"

namespace mhckpt::internal::local_restore {
namespace {

// Where `region` (inside `box`) starts in the row-major bytes of `box`, if
// those bytes are one contiguous run (the region spans whole rows: every
// dimension but the first is the box's own); nullopt otherwise.
std::optional<size_t> ContiguousAt(const Box& box, const Box& region, size_t elem) {
  if (box.count.empty()) return 0;
  size_t row = elem;
  for (size_t d = 1; d < box.count.size(); ++d) {
    if (region.start[d] != box.start[d] || region.count[d] != box.count[d]) return std::nullopt;
    row *= static_cast<size_t>(box.count[d]);
  }
  return static_cast<size_t>(region.start[0] - box.start[0]) * row;
}

}  // namespace

void LocalRestoreRun::PrepareDestinations() {
  for (const ArrayToRestore& a : arrays_) {
    for (const Destination& d : a.shards) {
      if (d.memory == Memory::kCuda) {
        device_copies_.emplace_back(BoxBytes(d.box, m_.Find(a.name)->dtype));
        dest_.push_back(device_copies_.back().data());
      } else {
        dest_.push_back(static_cast<std::byte*>(d.data));
      }
    }
    dest_start_.push_back(dest_.size() - a.shards.size());
  }
  // A want's array index is the marker's; map it back to the request.
  for (size_t i = 0; i < arrays_.size(); ++i) {
    request_of_array_[static_cast<size_t>(m_.Find(arrays_[i].name) - m_.arrays.data())] = i;
  }
}

std::vector<std::pair<std::byte*, size_t>> LocalRestoreRun::HostDestinations() const {
  std::vector<std::pair<std::byte*, size_t>> out;
  for (const ArrayToRestore& a : arrays_) {
    for (const Destination& d : a.shards) {
      if (d.memory == Memory::kCuda) continue;
      out.emplace_back(static_cast<std::byte*>(d.data), BoxBytes(d.box, m_.Find(a.name)->dtype));
    }
  }
  return out;
}

std::byte* LocalRestoreRun::DestinationOf(const Want& w) {
  return dest_[dest_start_[request_of_array_.at(w.array)] + w.dest];
}

Result<const std::byte*> LocalRestoreRun::FileBytes(const Piece& p) {
  if (p.rebuilt) {
    if (auto e = rebuild_errors_.find(p.writer); e != rebuild_errors_.end()) return e->second;
    auto it = rebuilt_.find(p.writer);
    if (it == rebuilt_.end()) return Internal("rebuilt file missing");
    return it->second.data();
  }
  if (auto e = open_errors_.find(p.writer); e != open_errors_.end()) return e->second;
  auto it = mapped_.find(p.writer);
  if (it == mapped_.end()) {
    const uint64_t want = files_.bytes[static_cast<size_t>(p.writer)];
    Result<io::MappedFile> f = io::MappedFile::OpenForReading(tier_.FilePath(m_.step, p.writer));
    Status s = f.status();
    if (s.ok() && f->size() != want) {
      s = DataLoss(fmt::format("'{}' is {} bytes, not {}", f->path(), f->size(), want));
    }
    if (!s.ok()) {
      open_errors_.emplace(p.writer, s);
      return s;
    }
    it = mapped_.emplace(p.writer, std::move(f).value()).first;
  }
  return it->second.data();
}

Result<const std::byte*> LocalRestoreRun::StoredBytes(const Piece& p) {
  const size_t ai = p.want->array, bi = p.box;
  const io::MarkerArray& a = m_.arrays[ai];
  const io::MarkerBox& b = a.boxes[bi];
  MHCKPT_ASSIGN_OR_RETURN(const std::byte* file, FileBytes(p));
  const std::byte* box = file + files_.offset[ai][bi];
  if (!options_.verify_checksums) return box;
  const int64_t rows = b.box.count.empty() ? 1 : b.box.count[0];
  const uint64_t row_bytes = rows > 0 ? BoxBytes(b.box, a.dtype) / static_cast<uint64_t>(rows) : 0;
  const int64_t per = std::max<int64_t>(b.chunk_rows, 1);
  int64_t first = 0, last = 0;
  if (!b.box.count.empty()) {
    first = (p.region.start[0] - b.box.start[0]) / per;
    last = (p.region.start[0] + p.region.count[0] - 1 - b.box.start[0]) / per;
  }
  for (int64_t k = first; k <= last; ++k) {
    auto [it, fresh] = checked_.try_emplace({p.rebuilt, ai, bi, k});
    if (fresh) {
      const int64_t r0 = k * per, r1 = std::min(rows, r0 + per);
      const size_t n = b.box.count.empty() ? BoxBytes(b.box, a.dtype)
                                           : static_cast<size_t>((r1 - r0) * row_bytes);
      it->second =
          CheckChunkChecksum(a, b, k, Checksum(box + static_cast<size_t>(r0) * row_bytes, n));
    }
    MHCKPT_RETURN_IF_ERROR(it->second);
  }
  return box;
}

bool LocalRestoreRun::CopiedWhileChecked(const Piece& p) const {
  const size_t elem = DTypeSize(m_.arrays[p.want->array].dtype);
  return options_.verify_checksums && p.want->rank == rank_ && p.server == rank_ &&
         ContiguousAt(m_.arrays[p.want->array].boxes[p.box].box, p.region, elem) &&
         ContiguousAt(p.want->box, p.region, elem);
}

Status LocalRestoreRun::CopyChecked(const Piece& p, const std::byte* box) {
  constexpr size_t kPiece = 256 << 10;  // in cache until hashed
  const size_t ai = p.want->array, bi = p.box;
  const io::MarkerArray& a = m_.arrays[ai];
  const io::MarkerBox& b = a.boxes[bi];
  const size_t elem = DTypeSize(a.dtype);
  // The piece is bytes [from, to) of the stored box, at `dst`.
  const size_t from = *ContiguousAt(b.box, p.region, elem), to = from + p.bytes;
  std::byte* dst = DestinationOf(*p.want) + *ContiguousAt(p.want->box, p.region, elem);
  const size_t total = BoxBytes(b.box, a.dtype);
  const int64_t rows = b.box.count.empty() ? 1 : b.box.count[0];
  const size_t row_bytes = rows > 0 ? total / static_cast<size_t>(rows) : 0;
  const size_t chunk_bytes =
      b.box.count.empty() ? total
                          : static_cast<size_t>(std::max<int64_t>(b.chunk_rows, 1)) * row_bytes;
  ChecksumStream sum;
  for (size_t c0 = from / chunk_bytes * chunk_bytes; c0 < to; c0 += chunk_bytes) {
    const size_t c1 = std::min(total, c0 + chunk_bytes);
    const auto k = static_cast<int64_t>(c0 / chunk_bytes);
    auto [it, fresh] = checked_.try_emplace({p.rebuilt, ai, bi, k});
    if (!fresh) {  // checked for another piece: copy only
      MHCKPT_RETURN_IF_ERROR(it->second);
      const size_t lo = std::max(c0, from), hi = std::min(c1, to);
      CopyUncached(dst + (lo - from), box + lo, hi - lo);
      continue;
    }
    sum.Reset();
    for (size_t at = c0; at < c1; at += kPiece) {
      const size_t end = std::min(c1, at + kPiece);
      const size_t lo = std::max(at, from), hi = std::min(end, to);
      if (lo < hi) CopyUncached(dst + (lo - from), box + lo, hi - lo);
      sum.Update(box + at, end - at);
    }
    it->second = CheckChunkChecksum(a, b, k, sum.Digest());
    MHCKPT_RETURN_IF_ERROR(it->second);
  }
  return OkStatus();
}

bool LocalRestoreRun::Direct(const Piece& p) const {
  const size_t elem = DTypeSize(m_.arrays[p.want->array].dtype);
  return p.want->rank != p.server &&
         ContiguousAt(m_.arrays[p.want->array].boxes[p.box].box, p.region, elem) &&
         ContiguousAt(p.want->box, p.region, elem);
}

void LocalRestoreRun::Serve() {
  out_.clear();
  failed_.clear();
  // Zeros for a direct piece that could not be served, sized once:
  // pending sends point into it.
  uint64_t widest = 0;
  for (size_t id : round_) {
    const Piece& p = pieces_[id];
    if (p.server == rank_ && Direct(p)) widest = std::max(widest, p.bytes);
  }
  zeros_.assign(widest, std::byte{0});
  for (size_t id : round_) {
    const Piece& p = pieces_[id];
    if (p.server != rank_) continue;
    const Want& w = *p.want;
    const io::MarkerArray& a = m_.arrays[w.array];
    const Box& stored = a.boxes[p.box].box;
    const size_t elem = DTypeSize(a.dtype);
    const bool direct = Direct(p);
    std::string& out = out_[w.rank];
    const size_t at = out.size();
    if (w.rank != rank_ && !direct) out.resize(at + p.bytes);
    const std::byte* box = nullptr;
    if (local_.ok()) {
      Status data;  // the stored bytes cannot serve it: step 5 looks elsewhere
      local_ = Guarded(fmt::format("restore of local step {}", m_.step), [&]() -> Status {
        if (CopiedWhileChecked(p)) {
          Result<const std::byte*> file = FileBytes(p);
          data = file.ok() ? CopyChecked(p, *file + files_.offset[w.array][p.box]) : file.status();
          return OkStatus();
        }
        Result<const std::byte*> stored_bytes = StoredBytes(p);
        if (!stored_bytes.ok()) {
          data = stored_bytes.status();
          return OkStatus();
        }
        box = *stored_bytes;
        if (w.rank == rank_) {
          CopyRegion(box, stored, DestinationOf(w), w.box, p.region, elem);
        } else if (!direct) {
          CopyRegion(box, stored, reinterpret_cast<std::byte*>(out.data() + at), p.region, p.region,
                     elem);
        }
        return OkStatus();
      });
      if (!data.ok()) {
        box = nullptr;
        failed_.emplace_back(id, fmt::format("{}: {}", SourceName(p), data.ToString()));
      }
    }
    if (direct) {
      // After an error the asker still gets its bytes' worth (zeros).
      const std::byte* src = local_.ok() && box != nullptr
                                 ? box + *ContiguousAt(stored, p.region, elem)
                                 : zeros_.data();
      comm_.PostSend(src, p.bytes, w.rank, kPieceTag, &direct_sends_);
    }
  }
}

void LocalRestoreRun::Exchange() {
  std::map<int, uint64_t> in;  // packed bytes from each server
  std::vector<MPI_Request> requests;
  for (size_t id : round_) {
    const Piece& p = pieces_[id];
    if (p.want->rank != rank_ || p.server == rank_) continue;
    if (Direct(p)) {
      const size_t elem = DTypeSize(m_.arrays[p.want->array].dtype);
      comm_.PostReceive(DestinationOf(*p.want) + *ContiguousAt(p.want->box, p.region, elem),
                        p.bytes, p.server, kPieceTag, &requests);
    } else {
      in[p.server] += p.bytes;
    }
  }
  std::map<int, std::string> received;
  for (auto& [peer, bytes] : in) {
    std::string& buf = received[peer];
    buf.resize(bytes);
    comm_.PostReceive(buf.data(), bytes, peer, kPieceTag, &requests);
  }
  for (auto& [peer, buf] : out_) {
    if (peer != rank_ && !buf.empty()) {
      comm_.PostSend(buf.data(), buf.size(), peer, kPieceTag, &direct_sends_);
    }
  }
  Comm::WaitAll(&requests);
  Comm::WaitAll(&direct_sends_);
  std::map<int, size_t> at;
  for (size_t id : round_) {
    const Piece& p = pieces_[id];
    if (p.want->rank != rank_ || p.server == rank_ || Direct(p)) continue;
    const std::byte* src =
        reinterpret_cast<const std::byte*>(received[p.server].data()) + at[p.server];
    at[p.server] += p.bytes;
    const io::MarkerArray& a = m_.arrays[p.want->array];
    CopyRegion(src, p.region, DestinationOf(*p.want), p.want->box, p.region, DTypeSize(a.dtype));
  }
}

Status LocalRestoreRun::FillDevices() {
  std::vector<CopyTask> tasks;
  size_t k = 0;
  for (const ArrayToRestore& a : arrays_) {
    for (const Destination& d : a.shards) {
      if (d.memory != Memory::kCuda) continue;
      std::vector<std::byte>& host = device_copies_[k++];
      tasks.push_back({d.data, host.data(), host.size(), d.device, d.stream});
    }
  }
  return tasks.empty() ? OkStatus() : CopyHostToDevice(tasks);
}

}  // namespace mhckpt::internal::local_restore
