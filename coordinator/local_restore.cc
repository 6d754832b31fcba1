// Restore from the local tier (coordinator/local_tier.h), run by every rank
// on its I/O thread:
//   1. Each rank checks its requests against the step's marker; one
//      agreement.
//   2. Every rank's requests go to every rank (one all-gather), so each rank
//      computes the same list of pieces: for every request and every stored
//      box it overlaps, the piece, the rank that asked for it, and the rank
//      that serves it — the asker itself when its node holds the writer's
//      file, else one of the holders, picked by the asker's rank so that the
//      load spreads.
//   3. Each rank serves its pieces from the writer files of its node (mapped
//      read-only): it checks the chunks of the stored box that a piece
//      overlaps against the marker, once each, then copies the piece into
//      the asker's destination (itself) or into one buffer per asker.
//   4. The buffers go point to point, one message per pair of ranks, and
//      each asker copies its pieces out in the same order; device
//      destinations are filled from host memory last. One agreement.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/local_tier.h"
#include "io/mapped_file.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

constexpr int kPieceTag = 7102;

// One destination of one rank, as every rank learns it in step 2.
struct Want {
  int rank = 0;
  size_t array = 0;  // into the marker
  size_t dest = 0;   // index of the destination in this rank's request list
  Box box;
};

// One piece: the part of stored box `box` of array `array` that `want` asks for.
struct Piece {
  const Want* want = nullptr;
  size_t box = 0;
  Box region;
  int server = 0;
  uint64_t bytes = 0;
};

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

std::string EncodeWants(const io::Marker& m, std::span<const ArrayToRestore> arrays) {
  std::vector<int64_t> v;
  for (const ArrayToRestore& a : arrays) {
    const io::MarkerArray* stored = m.Find(a.name);
    const auto ai = static_cast<int64_t>(stored - m.arrays.data());
    for (size_t d = 0; d < a.shards.size(); ++d) {
      const Box& box = a.shards[d].box;
      v.insert(v.end(), {ai, static_cast<int64_t>(d)});
      v.insert(v.end(), box.start.begin(), box.start.end());
      v.insert(v.end(), box.count.begin(), box.count.end());
    }
  }
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t)};
}

std::vector<Want> DecodeWants(const io::Marker& m, const std::vector<std::string>& all) {
  std::vector<Want> wants;
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<int64_t> v(all[r].size() / sizeof(int64_t));
    if (!v.empty()) std::memcpy(v.data(), all[r].data(), v.size() * sizeof(int64_t));
    for (size_t i = 0; i + 2 <= v.size();) {
      Want w;
      w.rank = static_cast<int>(r);
      w.array = static_cast<size_t>(v[i]);
      w.dest = static_cast<size_t>(v[i + 1]);
      const size_t dims = m.arrays.at(w.array).shape.size();
      w.box.start.assign(v.begin() + static_cast<std::ptrdiff_t>(i + 2),
                         v.begin() + static_cast<std::ptrdiff_t>(i + 2 + dims));
      w.box.count.assign(v.begin() + static_cast<std::ptrdiff_t>(i + 2 + dims),
                         v.begin() + static_cast<std::ptrdiff_t>(i + 2 + 2 * dims));
      i += 2 + 2 * dims;
      if (Volume(w.box.count).value_or(0) > 0) wants.push_back(std::move(w));
    }
  }
  return wants;
}

class LocalRestoreRun {
 public:
  LocalRestoreRun(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                  std::span<const ArrayToRestore> arrays, const RestoreOptions& options)
      : comm_(comm),
        tier_(tier),
        s_(s),
        m_(s.marker),
        arrays_(arrays),
        options_(options),
        rank_(comm.rank()),
        files_(m_) {}

  Status Run() {
    // 1.
    MHCKPT_RETURN_IF_ERROR(
        AgreeAll(Guarded(fmt::format("rank {}: restore of local step {}", rank_, m_.step),
                         [&] { return CheckRequests(m_, arrays_, options_, rank_); }),
                 comm_));
    // 2.
    wants_ = DecodeWants(m_, comm_.AllGatherBytes(EncodeWants(m_, arrays_)));
    MakePieces();
    PrepareDestinations();
    // 3.
    Serve();
    // 4.
    Exchange();
    if (local_.ok()) local_ = FillDevices();
    if (!local_.ok() && local_.message().rfind("rank ", 0) != 0) {
      local_ = Status(local_.code(), fmt::format("rank {}: {}", rank_, local_.message()));
    }
    return AgreeAll(local_, comm_);
  }

 private:
  void MakePieces() {
    for (const Want& w : wants_) {
      const io::MarkerArray& a = m_.arrays[w.array];
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        const io::MarkerBox& b = a.boxes[bi];
        if (!BoxesIntersect(b.box, w.box)) continue;
        const std::vector<int>& holders = s_.holders.at(static_cast<size_t>(b.writer));
        int server = w.rank;
        if (!std::binary_search(holders.begin(), holders.end(), w.rank)) {
          server = holders[static_cast<size_t>(w.rank) % holders.size()];
        }
        if (server != rank_ && w.rank != rank_) continue;
        Piece p{&w, bi, Intersection(b.box, w.box), server, 0};
        p.bytes = BoxBytes(p.region, a.dtype);
        if (p.bytes > 0) pieces_.push_back(std::move(p));
      }
    }
  }

  // Host memory for every destination of this rank: the caller's buffer,
  // or a host copy of a device one (filled in at the end).
  void PrepareDestinations() {
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

  std::byte* DestinationOf(const Want& w) {
    return dest_[dest_start_[request_of_array_.at(w.array)] + w.dest];
  }

  // The bytes of stored box `bi` of array `ai` in this node's copy of its
  // writer's file, its chunks around `region` checked.
  Result<const std::byte*> StoredBytes(size_t ai, size_t bi, const Box& region) {
    const io::MarkerArray& a = m_.arrays[ai];
    const io::MarkerBox& b = a.boxes[bi];
    auto it = mapped_.find(b.writer);
    if (it == mapped_.end()) {
      MHCKPT_ASSIGN_OR_RETURN(io::MappedFile f,
                              io::MappedFile::OpenForReading(tier_.FilePath(m_.step, b.writer)));
      if (f.size() != files_.bytes[static_cast<size_t>(b.writer)]) {
        return DataLoss(fmt::format("local step {}: '{}' is {} bytes, not {}", m_.step, f.path(),
                                    f.size(), files_.bytes[static_cast<size_t>(b.writer)]));
      }
      it = mapped_.emplace(b.writer, std::move(f)).first;
    }
    const std::byte* box = it->second.data() + files_.offset[ai][bi];
    if (!options_.verify_checksums) return box;
    const int64_t rows = b.box.count.empty() ? 1 : b.box.count[0];
    const uint64_t row_bytes =
        rows > 0 ? BoxBytes(b.box, a.dtype) / static_cast<uint64_t>(rows) : 0;
    const int64_t per = std::max<int64_t>(b.chunk_rows, 1);
    int64_t first = 0, last = 0;
    if (!b.box.count.empty()) {
      first = (region.start[0] - b.box.start[0]) / per;
      last = (region.start[0] + region.count[0] - 1 - b.box.start[0]) / per;
    }
    for (int64_t k = first; k <= last; ++k) {
      if (!checked_.insert({ai, bi, k}).second) continue;
      const int64_t r0 = k * per, r1 = std::min(rows, r0 + per);
      const size_t n = b.box.count.empty() ? BoxBytes(b.box, a.dtype)
                                           : static_cast<size_t>((r1 - r0) * row_bytes);
      MHCKPT_RETURN_IF_ERROR(
          CheckChunkChecksum(a, b, k, Checksum(box + static_cast<size_t>(r0) * row_bytes, n)));
    }
    return box;
  }

  // A piece goes as a message of its own, straight from the server's
  // mapped file into the asker's destination, when its bytes are one run on
  // both sides (the same sharding as the save's, say); else it is packed.
  bool Direct(const Piece& p) const {
    const size_t elem = DTypeSize(m_.arrays[p.want->array].dtype);
    return p.want->rank != p.server &&
           ContiguousAt(m_.arrays[p.want->array].boxes[p.box].box, p.region, elem) &&
           ContiguousAt(p.want->box, p.region, elem);
  }

  void Serve() {
    // Zeros for a direct piece after an error, sized once: pending sends
    // point into it.
    uint64_t widest = 0;
    for (const Piece& p : pieces_) {
      if (p.server == rank_ && Direct(p)) widest = std::max(widest, p.bytes);
    }
    zeros_.assign(widest, std::byte{0});
    for (const Piece& p : pieces_) {
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
        local_ = Guarded(fmt::format("restore of local step {}", m_.step), [&]() -> Status {
          MHCKPT_ASSIGN_OR_RETURN(box, StoredBytes(w.array, p.box, p.region));
          if (w.rank == rank_) {
            CopyRegion(box, stored, DestinationOf(w), w.box, p.region, elem);
          } else if (!direct) {
            CopyRegion(box, stored, reinterpret_cast<std::byte*>(out.data() + at), p.region,
                       p.region, elem);
          }
          return OkStatus();
        });
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

  // The direct pieces (in piece order) and then one packed message per pair
  // of ranks; MPI keeps the order of messages between two ranks on one tag,
  // and both sides post in the same order.
  void Exchange() {
    std::map<int, uint64_t> in;  // packed bytes from each server
    std::vector<MPI_Request> requests;
    for (const Piece& p : pieces_) {
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
    for (const Piece& p : pieces_) {
      if (p.want->rank != rank_ || p.server == rank_ || Direct(p)) continue;
      const std::byte* src =
          reinterpret_cast<const std::byte*>(received[p.server].data()) + at[p.server];
      at[p.server] += p.bytes;
      const io::MarkerArray& a = m_.arrays[p.want->array];
      CopyRegion(src, p.region, DestinationOf(*p.want), p.want->box, p.region, DTypeSize(a.dtype));
    }
  }

  Status FillDevices() {
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

  const Comm& comm_;
  const LocalTier& tier_;
  const LocalStep& s_;
  const io::Marker& m_;
  const std::span<const ArrayToRestore> arrays_;
  const RestoreOptions& options_;
  const int rank_;
  const WriterFiles files_;

  std::vector<Want> wants_;
  std::vector<Piece> pieces_;  // those this rank serves or receives, in want order
  std::vector<std::byte*> dest_;
  std::vector<size_t> dest_start_;  // per request array: its first in dest_
  std::map<size_t, size_t> request_of_array_;
  std::vector<std::vector<std::byte>> device_copies_;  // moves keep their data()
  std::map<int, io::MappedFile> mapped_;               // writer -> its file on this node
  std::set<std::tuple<size_t, size_t, int64_t>> checked_;
  std::map<int, std::string> out_;         // asker -> the packed pieces served to it
  std::vector<MPI_Request> direct_sends_;  // the pieces sent as they are, then the packs
  std::vector<std::byte> zeros_;
  Status local_;
};

}  // namespace

Status RestoreLocal(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                    std::span<const ArrayToRestore> arrays, const RestoreOptions& options) {
  return LocalRestoreRun(comm, tier, s, arrays, options).Run();
}

}  // namespace mhckpt::internal
