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
//      the asker's destination (itself; checked while copied when the piece
//      is one run on both sides) or into one buffer per asker. Meanwhile a
//      thread of its own faults in the rank's destination pages.
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
// Where each part lives: LocalRestoreRun (coordinator/local_restore_run.h)
// runs the steps; steps 1, 2 and 5 are here, steps 3, 4 and 6 in
// coordinator/local_restore_serve.cc.
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/local_restore_run.h"
#include "io/pread_reader.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace local_restore {
namespace {

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

}  // namespace

Status LocalRestoreRun::Run() {
  // 1.
  MHCKPT_RETURN_IF_ERROR(
      AgreeAll(Guarded(fmt::format("rank {}: restore of local step {}", rank_, m_.step),
                       [&] { return CheckRequests(m_, arrays_, options_, rank_); }),
               comm_));
  // 2.
  wants_ = DecodeWants(m_, comm_.AllGatherBytes(EncodeWants(m_, arrays_)));
  MakePieces();
  PrepareDestinations();
  // The destinations' pages faulted in beside the copies into them.
  std::optional<PrefaultThread> prefault;
  if (options_.prefault) {
    std::vector<std::pair<std::byte*, size_t>> host = HostDestinations();
    uint64_t bytes = 0;
    for (const auto& [data, n] : host) bytes += n;
    if (bytes >= io::kPrefaultMinBytes) prefault.emplace(std::move(host));
  }
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

void LocalRestoreRun::NameRank(Status* s) const {
  if (!s->ok() && s->message().rfind("rank ", 0) != 0) {
    *s = Status(s->code(), fmt::format("rank {}: {}", rank_, s->message()));
  }
}

void LocalRestoreRun::MakePieces() {
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

std::string LocalRestoreRun::SourceName(const Piece& p) const {
  if (p.rebuilt) {
    return fmt::format("rank {}'s file rebuilt from parity on rank {}", p.writer, p.server);
  }
  return fmt::format("rank {}'s file on node {} (read by rank {})", p.writer,
                     tier_.nodes().node_of(p.server), p.server);
}

std::map<size_t, std::string> LocalRestoreRun::GatherFailures() {
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

Status LocalRestoreRun::ChooseOtherSources(const std::map<size_t, std::string>& failed,
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

void LocalRestoreRun::RebuildFromParity(const std::vector<size_t>& pending) {
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

void LocalRestoreRun::LogFallbacks() const {
  if (rank_ != 0 || attempts_.empty()) return;
  const auto& [id, a] = *attempts_.begin();
  const Piece& p = pieces_[id];
  Logger()->warn(
      "mhckpt: local step {}: {} piece(s) served from another source than the first; e.g. "
      "array '{}' box {}: {} -> served from {}",
      m_.step, attempts_.size(), m_.arrays[p.want->array].name, BoxToString(p.region),
      a.tried.front(), SourceName(p));
}

}  // namespace local_restore

Status RestoreLocal(const Comm& comm, const LocalTier& tier, const LocalStep& s,
                    std::span<const ArrayToRestore> arrays, const RestoreOptions& options) {
  return local_restore::LocalRestoreRun(comm, tier, s, arrays, options).Run();
}

}  // namespace mhckpt::internal
