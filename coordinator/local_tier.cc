#include "coordinator/local_tier.h"

#include <xxhash.h>

#include <cstring>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/local_parity.h"
#include "coordinator/local_recovery.h"
#include "coordinator/retention.h"
#include "coordinator/root_upkeep.h"
#include "io/mapped_file.h"
#include "io/posix_file.h"

namespace mhckpt::internal {
namespace {

int64_t TextHash(const std::string& text) {
  return static_cast<int64_t>(XXH3_64bits(text.data(), text.size()) >> 1);
}

// `s`, its message prefixed with "rank R: `what`: " unless it names a rank.
Status NameRank(Status s, int rank, std::string_view what) {
  if (s.ok() || s.message().rfind("rank ", 0) == 0) return s;
  return Status(s.code(), fmt::format("rank {}: {}: {}", rank, what, s.message()));
}

}  // namespace

LocalTier::LocalTier(const Options& options)
    : keep_(options.local_max_to_keep), store_(options.local_dir) {}

LocalTier::~LocalTier() = default;

std::string LocalTier::FilePath(int64_t step, int writer) const {
  return store_.paths().FilePath(step, writer);
}

std::string LocalTier::ParityPath(int64_t step, int rank) const {
  return store_.paths().ParityPath(step, rank);
}

std::shared_ptr<io::KeptMappings::Mapping> LocalTier::KeptMapping(int64_t step, int writer,
                                                                  uint64_t bytes) {
  return landing_ == nullptr ? nullptr : landing_->Kept(FilePath(step, writer), bytes);
}

std::vector<int> LocalTier::Unprotected() const {
  return redundancy_ == nullptr ? std::vector<int>() : redundancy_->Unprotected();
}

Status LocalTier::Open(const Comm& comm, const Options& options, const Deletions& deleted) {
  nodes_ = Nodes::Discover(comm, options.node_id);
  landing_ = std::make_unique<LandingFile>(dir(), comm.rank());
  redundancy_ = MakeLocalRedundancy(options, nodes_, store_.paths());
  const int rank = comm.rank();
  const bool leader = nodes_.leads(rank);
  // The node's report: per committed step, what it holds (NodeHoldings).
  nlohmann::json report = nlohmann::json::array();
  std::map<int64_t, std::string> texts;
  Status s;
  if (leader) {
    s = Guarded(fmt::format("rank {}: local dir '{}'", rank, dir()), [&]() -> Status {
      MHCKPT_ASSIGN_OR_RETURN(std::vector<StoredStep> steps, store_.Open(options));
      for (StoredStep& e : steps) {
        report.push_back(NodeHoldings(store_.paths(), e.step, e.marker, TextHash(e.text)));
        texts[e.step] = std::move(e.text);
      }
      return OkStatus();
    });
    s = NameRank(s, rank, fmt::format("local dir '{}'", dir()));
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm));

  std::vector<std::string> reports = comm.GatherBytes(leader ? report.dump() : "[]", 0);
  std::string view_text;
  if (rank == 0) {
    s = Guarded("rank 0: local tier recovery", [&] {
      view_text = ElectRestorable(nodes_, reports, keep_, dir(), deleted).dump();
      if (nodes_.count() == 1) {
        Logger()->warn(
            "mhckpt: the job runs on one node: the local tier has no other node to keep copies "
            "or parity on, so it survives process crashes but not the loss of the node");
      } else if (const std::vector<int> alone = Unprotected(); !alone.empty()) {
        Logger()->warn(
            "mhckpt: rank(s) {} of {} have no parity group (alone at their position on nodes of "
            "unequal size): their boxes are kept on their own node only, so a local step does "
            "not survive the loss of that node",
            fmt::join(alone, ","), nodes_.ranks());
      }
    });
  }
  // Why: only rank 0 decided; every rank must see its outcome.
  MHCKPT_RETURN_IF_ERROR(ShareText(comm, 0, s, &view_text));
  const nlohmann::json view = nlohmann::json::parse(view_text);

  // The markers of the restorable steps, from a node that holds each, and
  // the files of lost ranks rebuilt from parity.
  std::set<int64_t> kept, stale;
  Status local;
  for (const nlohmann::json& v : view) {
    const auto step = v.at("step").get<int64_t>();
    const int source = v.at("source").get<int>();
    std::string text = rank == source ? texts[step] : std::string();
    Result<io::Marker> m =
        ShareMarker(comm, source, &text, fmt::format("local step {} (from rank {})", step, source));
    // This node holds another (older) save of the step: removed below.
    if (auto mine = texts.find(step); mine != texts.end() && mine->second != text) {
      stale.insert(step);
    }
    auto ls = std::make_shared<LocalStep>();
    ls->holders = v.at("holders").get<std::vector<std::vector<int>>>();
    ls->parity_groups = v.at("groups").get<std::vector<std::vector<int>>>();
    if (m.ok()) {
      ls->marker = std::move(m).value();
    } else if (local.ok()) {
      local = m.status();
    }
    const auto parity_holders = v.at("parity_holders").get<std::vector<std::vector<int>>>();
    for (const auto& r : v.at("rebuild")) {
      const int lost = r.at(0).get<int>(), rebuilder = r.at(1).get<int>();
      Status rebuilt = RebuildFile(comm, store_.paths(), *ls, lost, rebuilder, parity_holders);
      if (local.ok()) local = rebuilt;
      ls->holders[static_cast<size_t>(lost)] = nodes_.ranks_of(nodes_.node_of(rebuilder));
    }
    kept.insert(step);
    Add(step, std::move(ls));
  }
  // Why an agreement: a rank that could not read a marker or rebuild a file
  // must not leave the others restoring from a view it does not share.
  if (Status agreed = AgreeAll(local, comm); !agreed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    view_.clear();
    return agreed;
  }

  // Steps no one can restore take node memory for nothing.
  Status removed;
  if (leader) {
    for (const auto& [step, text] : texts) {
      if (!kept.count(step) || stale.count(step)) removed = store_.Remove(step);
    }
  }
  return AgreeAll(removed, comm);
}

Status LocalTier::Write(const Comm& comm, const io::Marker& plan, const StagedBoxFn& staged,
                        std::vector<BoxSum>* sums, const KnownBoxFn& known) {
  const int rank = comm.rank();
  const int64_t step = plan.step;
  // 1. The step directory on every node: the spare, recycled (its files keep
  // their pages), or a fresh one. No committed step is touched.
  Status s;
  if (nodes_.leads(rank)) {
    std::set<std::string> rewritten;
    for (int r : nodes_.ranks_of(nodes_.node_of(rank))) {
      rewritten.insert(WriterFileName(r));
      redundancy_->AddRewritten(r, &rewritten);
    }
    s = NameRank(store_.MakeStepDir(step, rewritten), rank, "local dir");
  }
  if (s.ok()) s = fault::Hit("local_create");
  if (Status agreed = AgreeAll(s, comm); !agreed.ok()) return s.ok() ? agreed : s;

  // 2. This rank's file, and those it receives.
  const WriterFiles files(plan);
  io::MappedFile own;
  std::optional<StagingBuffer> written;  // the landing file, written here and moved
  const std::byte* landed = nullptr;     // the landing file's mapping, moved into the step
  s = Guarded(fmt::format("rank {}: local write of step {}", rank, step), [&]() -> Status {
    std::vector<io::MappedFile::Piece> pieces;
    for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
      const io::MarkerArray& a = plan.arrays[ai];
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        if (a.boxes[bi].writer != rank) continue;
        std::span<const std::byte> box = staged(ai, bi);
        if (box.data() == nullptr && BoxBytes(a.boxes[bi].box, a.dtype) > 0) {
          return Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                      a.name, BoxToString(a.boxes[bi].box), rank));
        }
        if (!box.empty()) pieces.push_back({files.offset[ai][bi], box.data(), box.size()});
        // Hashed by the copy, in the plan's chunks: not hashed again.
        const StagedBox* k = known ? known(ai, bi) : nullptr;
        if (k != nullptr && k->hashed_chunk_bytes > 0 && k->size == box.size() &&
            k->hashed_chunk_bytes == BoxChunkBytes(a.boxes[bi], box.size())) {
          sums->push_back(
              {static_cast<uint32_t>(ai), static_cast<uint32_t>(bi), k->sum, k->chunks});
        } else {
          sums->push_back(BoxChecksums(a, ai, bi, box));
        }
      }
    }
    // The boxes staged in this rank's landing file, back to back as in the
    // file: the landing file becomes the file (no copy; reserved in full
    // when the save took it).
    const uint64_t bytes = files.BytesOf(rank);
    if (landing_ != nullptr && !pieces.empty()) {
      const std::byte* base = pieces.front().data - pieces.front().offset;
      uint64_t covered = 0;
      bool in_place = true;
      for (const io::MappedFile::Piece& p : pieces) {
        in_place = in_place && p.data == base + p.offset;
        covered += p.size;
      }
      if (in_place && covered == bytes && landing_->Take(base, bytes, FilePath(step, rank))) {
        landed = base;
        return fault::Hit("local_write");
      }
    }
    // Otherwise copied (one copy) into the landing file if no later save
    // holds it, and moved: its mapping is kept, so that a blocking save finds
    // it warm and lands in it as a lazy one does (coordinator/lazy_copier.h).
    if (landing_ != nullptr && !pieces.empty()) {
      written = landing_->TryAcquire(bytes, /*warm_only=*/false);
      if (written) {
        for (const io::MappedFile::Piece& p : pieces) {
          std::memcpy(written->data() + p.offset, p.data, p.size);
        }
        if (landing_->Take(written->data(), bytes, FilePath(step, rank))) {
          landed = written->data();
          return fault::Hit("local_write");
        }
        written.reset();
      }
    }
    // Else written (pages the write allocates: a full tmpfs is ENOSPC here),
    // then mapped to send.
    MHCKPT_ASSIGN_OR_RETURN(own,
                            io::MappedFile::CreateByWrites(FilePath(step, rank), bytes, pieces));
    return fault::Hit("local_write");
  });
  std::unique_ptr<RedundancySave> exchange;
  if (s.ok()) {
    Result<std::unique_ptr<RedundancySave>> begun = redundancy_->BeginSave(rank, step, files);
    if (begun.ok()) {
      exchange = std::move(begun).value();
    } else {
      s = begun.status();
    }
  }
  s = NameRank(s, rank, "local tier");
  // Why an agreement: every rank must have its buffers before any copy moves.
  if (Status agreed = AgreeAll(s, comm); !agreed.ok()) return s.ok() ? agreed : s;

  // 3. The copies (or parity segments), point to point.
  std::vector<MPI_Request> requests;
  exchange->Post(comm, {landed != nullptr ? landed : own.data(), files.BytesOf(rank)}, &requests);
  Comm::WaitAll(&requests);
  // The bytes of every file this rank wrote durable before its node's marker
  // (step 4; a no-op on a tmpfs): its own, then what it received.
  s = own.Close();
  if (s.ok()) s = io::FsyncFile(FilePath(step, rank));
  if (Status finished = exchange->Finish(); s.ok()) s = finished;
  if (s.ok()) s = fault::Hit("local_exchange");
  return s;
}

Status LocalTier::Commit(const Comm& comm, const io::Marker& marker, const std::string& text) {
  Status s;
  const std::vector<std::vector<int>> groups = redundancy_->Groups();
  if (nodes_.leads(comm.rank())) {
    // The parity groups of the save, for a rebuild after the nodes changed.
    s = NameRank(store_.Commit(marker, text, groups), comm.rank(), "local marker");
  }
  s = AgreeAll(s, comm);
  if (!s.ok()) {
    Abandon(comm, marker.step);
    return s;
  }
  auto local = std::make_shared<LocalStep>();
  local->marker = marker;
  local->parity_groups = groups;
  local->holders.resize(static_cast<size_t>(marker.world_size));
  for (int w = 0; w < marker.world_size; ++w) {
    local->holders[static_cast<size_t>(w)] = redundancy_->Holders(w);
  }
  Add(marker.step, std::move(local));
  Keep(comm);
  return OkStatus();
}

void LocalTier::Abandon(const Comm& comm, int64_t step) {
  if (nodes_.leads(comm.rank())) store_.Remove(step).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    view_.erase(step);
  }
}

Status LocalTier::CheckDeletable(const Comm& comm, int64_t step) const {
  // Why a vote: a reader on any rank (a drain, a partner's restore) keeps
  // the step's files on every node.
  if (comm.AllreduceMax(holds_.IsHeld(step) ? 1 : 0) != 0) {
    return FailedPrecondition(
        fmt::format("local step {} is held by a reader (a drain of it to the shared root, or a "
                    "restore); delete it once that has ended",
                    step));
  }
  return OkStatus();
}

Status LocalTier::Delete(const Comm& comm, int64_t step) {
  MHCKPT_RETURN_IF_ERROR(CheckDeletable(comm, step));
  Status s;
  if (nodes_.leads(comm.rank())) s = store_.Remove(step);
  {
    std::lock_guard<std::mutex> lock(mu_);
    view_.erase(step);
  }
  return AgreeAll(s, comm);
}

// Save step 5, after an agreed commit: the steps the retention policy no
// longer keeps (StepsToDelete, the shared root's policy with the newest keep_
// and no keep_period) leave the view unless held on some rank; the node's
// lowest rank drops them (LocalStore::Drop: the first becomes the next save's
// spare).
void LocalTier::Keep(const Comm& comm) {
  std::vector<int64_t> past, held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int64_t> steps;
    steps.reserve(view_.size());
    for (const auto& [step, s] : view_) steps.push_back(step);
    past = StepsToDelete(steps, keep_, /*keep_period=*/0);
  }
  for (int64_t step : past) held.push_back(holds_.IsHeld(step) ? 1 : 0);
  // Why a vote: a step held on any rank stays on every node, and the view
  // stays the same on every rank (`past` is: the view is agreed).
  if (past.empty()) return;
  comm.AllreduceMax(&held);
  std::vector<int64_t> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < past.size(); ++i) {
      if (held[i] != 0) continue;
      view_.erase(past[i]);
      drop.push_back(past[i]);
    }
  }
  if (!nodes_.leads(comm.rank())) return;
  for (int64_t step : drop) store_.Drop(step);
  // The pages of the files removed now are freed once no mapping keeps
  // them (the node's other ranks let theirs go at their next save).
  landing_->ForgetDeleted();
  redundancy_->ForgetDeleted();
}

void LocalTier::Add(int64_t step, std::shared_ptr<const LocalStep> s) {
  std::lock_guard<std::mutex> lock(mu_);
  view_[step] = std::move(s);
}

std::vector<int64_t> LocalTier::Steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> steps;
  steps.reserve(view_.size());
  for (const auto& [step, s] : view_) steps.push_back(step);
  return steps;
}

std::shared_ptr<const LocalStep> LocalTier::Find(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = view_.find(step);
  return it == view_.end() ? nullptr : it->second;
}

}  // namespace mhckpt::internal
