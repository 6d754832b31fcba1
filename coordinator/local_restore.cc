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
//      each asker copies its pieces out in the same order. One agreement on
//      every error that is not about the stored bytes.
//   5. A piece its server could not serve whole (a chunk whose checksum
//      differs, a file missing, short or unreadable on that node) is not an
//      error yet: the servers' failures go to every rank (one all-gather,
//      after one allreduce that says whether there are any), and every rank
//      makes the same new choice for each such piece — a holder of the
//      writer's file on a node not tried yet, else (with parity) the
//      writer's file rebuilt in memory from its parity group on one rank
//      (LocalSources, coordinator/local_sources.h, chooses; RebuildInMemory,
//      coordinator/local_parity.h, rebuilds) — and steps 3-5 run again for
//      those pieces only. Only when a piece has
//      no source left does the step fail: DataLoss naming the array, the box
//      and every source tried, on every rank. A restore that needed another
//      source says so in one log line (rank 0).
//   6. Device destinations are filled from host memory; one agreement.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/local_parity.h"
#include "coordinator/local_sources.h"
#include "coordinator/local_tier.h"
#include "io/mapped_file.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

// One destination of one rank, as every rank learns it in step 2.
struct Want {
  int rank = 0;
  size_t array = 0;  // into the marker
  size_t dest = 0;   // index of the destination in this rank's request list
  Box box;
};

// One piece: the part of stored box `box` of the want's array that `want`
// asks for, held in writer `writer`'s file, and who serves it now: `server`,
// from its node's copy of that file, or (`rebuilt`) from the file rebuilt
// from parity in its memory. The same list on every rank.
struct Piece {
  const Want* want = nullptr;
  size_t box = 0;
  Box region;
  int writer = 0;
  uint64_t bytes = 0;
  int server = 0;
  bool rebuilt = false;
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
        files_(m_),
        sources_(tier.nodes(), s) {}

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
    std::vector<size_t> pending(pieces_.size());
    for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
    while (!pending.empty()) {
      round_.clear();
      for (size_t id : pending) {
        const Piece& p = pieces_[id];
        if (p.server == rank_ || p.want->rank == rank_) round_.push_back(id);
      }
      RebuildFromParity(pending);
      // 3.
      Serve();
      // 4.
      Exchange();
      NameRank(&local_);
      MHCKPT_RETURN_IF_ERROR(AgreeAll(local_, comm_));
      // 5.
      std::map<size_t, std::string> failed = GatherFailures();
      if (failed.empty()) break;
      pending.clear();
      MHCKPT_RETURN_IF_ERROR(ChooseOtherSources(failed, &pending));
    }
    LogFallbacks();
    // 6.
    local_ = FillDevices();
    NameRank(&local_);
    return AgreeAll(local_, comm_);
  }

 private:
  void NameRank(Status* s) const {
    if (!s->ok() && s->message().rfind("rank ", 0) != 0) {
      *s = Status(s->code(), fmt::format("rank {}: {}", rank_, s->message()));
    }
  }

  void MakePieces() {
    for (const Want& w : wants_) {
      const io::MarkerArray& a = m_.arrays[w.array];
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        const io::MarkerBox& b = a.boxes[bi];
        if (!BoxesIntersect(b.box, w.box)) continue;
        const LocalSources::Source first = sources_.First(b.writer, w.rank);
        Piece p{&w, bi, Intersection(b.box, w.box), b.writer, 0, first.server, first.rebuilt};
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

  // The bytes of writer `writer`'s file as piece `p` is served: this node's
  // copy, mapped once, or the file rebuilt from parity here.
  Result<const std::byte*> FileBytes(const Piece& p) {
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

  // The bytes of piece `p`'s stored box at its source, the chunks around its
  // region checked (once each per source).
  Result<const std::byte*> StoredBytes(const Piece& p) {
    const size_t ai = p.want->array, bi = p.box;
    const io::MarkerArray& a = m_.arrays[ai];
    const io::MarkerBox& b = a.boxes[bi];
    MHCKPT_ASSIGN_OR_RETURN(const std::byte* file, FileBytes(p));
    const std::byte* box = file + files_.offset[ai][bi];
    if (!options_.verify_checksums) return box;
    const int64_t rows = b.box.count.empty() ? 1 : b.box.count[0];
    const uint64_t row_bytes =
        rows > 0 ? BoxBytes(b.box, a.dtype) / static_cast<uint64_t>(rows) : 0;
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

  // A piece goes as a message of its own, straight from the server's
  // mapped file into the asker's destination, when its bytes are one run on
  // both sides (the same sharding as the save's, say); else it is packed.
  bool Direct(const Piece& p) const {
    const size_t elem = DTypeSize(m_.arrays[p.want->array].dtype);
    return p.want->rank != p.server &&
           ContiguousAt(m_.arrays[p.want->array].boxes[p.box].box, p.region, elem) &&
           ContiguousAt(p.want->box, p.region, elem);
  }

  // Where a source of piece `p` is, for messages.
  std::string SourceName(const Piece& p) const {
    if (p.rebuilt) {
      return fmt::format("rank {}'s file rebuilt from parity on rank {}", p.writer, p.server);
    }
    return fmt::format("rank {}'s file on node {} (read by rank {})", p.writer,
                       tier_.nodes().node_of(p.server), p.server);
  }

  void Serve() {
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
          Result<const std::byte*> stored_bytes = StoredBytes(p);
          if (!stored_bytes.ok()) {
            data = stored_bytes.status();
            return OkStatus();
          }
          box = *stored_bytes;
          if (w.rank == rank_) {
            CopyRegion(box, stored, DestinationOf(w), w.box, p.region, elem);
          } else if (!direct) {
            CopyRegion(box, stored, reinterpret_cast<std::byte*>(out.data() + at), p.region,
                       p.region, elem);
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

  // The direct pieces (in piece order) and then one packed message per pair
  // of ranks; MPI keeps the order of messages between two ranks on one tag,
  // and both sides post in the same order.
  void Exchange() {
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

  // 5, collective: every server's failed pieces of this round, on every
  // rank (piece -> what failed). Empty on every rank when none failed.
  std::map<size_t, std::string> GatherFailures() {
    std::map<size_t, std::string> failed;
    if (comm_.AllreduceMax(failed_.empty() ? 0 : 1) == 0) return failed;
    nlohmann::json mine = nlohmann::json::array();
    for (const auto& [id, why] : failed_) mine.push_back({id, why});
    for (const std::string& text : comm_.AllGatherBytes(mine.dump())) {
      for (const nlohmann::json& f : nlohmann::json::parse(text)) {
        failed[f.at(0).get<size_t>()] = f.at(1).get<std::string>();
      }
    }
    return failed;
  }

  // 5: a new source for each failed piece (the same choice on every rank:
  // `failed` is agreed), into `pending`; DataLoss when a piece has none.
  Status ChooseOtherSources(const std::map<size_t, std::string>& failed,
                            std::vector<size_t>* pending) {
    std::vector<size_t> lost;
    for (const auto& [id, why] : failed) {
      Piece& p = pieces_[id];
      const std::optional<LocalSources::Source> next =
          sources_.Next(p.writer, p.want->rank, {p.server, p.rebuilt}, why, &attempts_[id]);
      if (!next) {
        lost.push_back(id);
        continue;
      }
      p.server = next->server;
      p.rebuilt = next->rebuilt;
      pending->push_back(id);
    }
    if (lost.empty()) return OkStatus();
    const Piece& p = pieces_[lost.front()];
    const io::MarkerArray& a = m_.arrays[p.want->array];
    const std::string parity = sources_.NoParityReason(p.writer);
    return DataLoss(fmt::format(
        "local step {}: array '{}' box {} (rank {} asked for box {}; stored box {}, in rank {}'s "
        "file): no intact copy of it in this job: tried {}{}{}",
        m_.step, a.name, BoxToString(p.region), p.want->rank, BoxToString(p.want->box),
        BoxToString(a.boxes[p.box].box), p.writer, fmt::join(attempts_[lost.front()].tried, "; "),
        parity,
        lost.size() > 1 ? fmt::format(" (and {} more pieces without a source)", lost.size() - 1)
                        : ""));
  }

  // 5, collective: the files of the writers that pieces of `pending` are now
  // to be served from parity for (the same on every rank), rebuilt in the
  // memory of their server (RebuildInMemory). A file that cannot be rebuilt
  // serves no piece (step 5 then has no source left for them).
  void RebuildFromParity(const std::vector<size_t>& pending) {
    std::set<int> writers;
    for (size_t id : pending) {
      const Piece& p = pieces_[id];
      if (p.rebuilt && !rebuilds_.count(p.writer)) writers.insert(p.writer);
    }
    if (writers.empty()) return;
    RebuildInMemory(
        comm_, tier_.paths(), s_, writers, [this](int m) { return sources_.HolderOf(m); },
        &parity_inputs_, &rebuilt_, &rebuild_errors_);
    rebuilds_.insert(writers.begin(), writers.end());
  }

  // Rank 0, after a restore that needed other sources: one line.
  void LogFallbacks() const {
    if (rank_ != 0 || attempts_.empty()) return;
    const auto& [id, a] = *attempts_.begin();
    const Piece& p = pieces_[id];
    Logger()->warn(
        "mhckpt: local step {}: {} piece(s) served from another source than the first; e.g. "
        "array '{}' box {}: {} -> served from {}",
        m_.step, attempts_.size(), m_.arrays[p.want->array].name, BoxToString(p.region),
        a.tried.front(), SourceName(p));
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
  std::vector<Piece> pieces_;  // every rank's, in want order: the same on every rank
  std::vector<size_t> round_;  // this round's pieces this rank serves or receives
  std::vector<std::byte*> dest_;
  std::vector<size_t> dest_start_;  // per request array: its first in dest_
  std::map<size_t, size_t> request_of_array_;
  std::vector<std::vector<std::byte>> device_copies_;  // moves keep their data()
  std::map<int, io::MappedFile> mapped_;               // writer -> its file on this node
  std::map<int, Status> open_errors_;                  // writer -> why its file cannot serve
  // (rebuilt, array, box, chunk) -> the outcome of its check.
  std::map<std::tuple<bool, size_t, size_t, int64_t>, Status> checked_;
  std::map<int, std::string> out_;         // asker -> the packed pieces served to it
  std::vector<MPI_Request> direct_sends_;  // the pieces sent as they are, then the packs
  std::vector<std::byte> zeros_;
  Status local_;  // this rank's first error that is not about the stored bytes

  // Step 5.
  std::vector<std::pair<size_t, std::string>> failed_;  // this round, as server
  LocalSources sources_;                                // agreed choices
  std::map<size_t, LocalSources::Attempts> attempts_;   // agreed
  std::set<int> rebuilds_;                              // writers rebuilt (agreed)
  std::map<int, Status> rebuild_errors_;                // writer -> why not (agreed)
  std::map<int, std::vector<std::byte>> rebuilt_;       // writer -> its file, on its rebuilder
  SegmentReader parity_inputs_;
};

}  // namespace

Status RestoreLocal(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                    std::span<const ArrayToRestore> arrays, const RestoreOptions& options) {
  return LocalRestoreRun(comm, tier, s, arrays, options).Run();
}

}  // namespace mhckpt::internal
