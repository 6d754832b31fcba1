#include "coordinator/local_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/retention.h"
#include "io/layout.h"
#include "io/mapped_file.h"

namespace mhckpt::internal {
namespace {

// The tag of the copies of writer files (point to point, on the I/O
// thread's communicator, between two agreements: nothing else is in flight).
constexpr int kCopyTag = 7101;

// One node's report at recovery: for each committed step, the hash of its
// marker text, the world size at save, the marker's creation time, and the
// writers whose files it holds whole. Encoded as int64 values in a string.
std::string EncodeValues(const std::vector<int64_t>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t)};
}

std::vector<int64_t> DecodeValues(const std::string& s) {
  std::vector<int64_t> v(s.size() / sizeof(int64_t));
  if (!v.empty()) std::memcpy(v.data(), s.data(), v.size() * sizeof(int64_t));
  return v;
}

int64_t TextHash(const std::string& text) {
  return static_cast<int64_t>(XXH3_64bits(text.data(), text.size()) >> 1);
}

}  // namespace

// ---- Nodes ----

Nodes Nodes::Discover(const Comm& comm, int node_id) {
  const int64_t key = node_id >= 0 ? node_id : comm.SharedMemoryLeader();
  std::vector<std::string> keys = comm.AllGatherBytes(EncodeValues({key}));
  std::vector<int64_t> key_of_rank;
  key_of_rank.reserve(keys.size());
  for (const std::string& k : keys) key_of_rank.push_back(DecodeValues(k).at(0));
  return Nodes(key_of_rank);
}

Nodes::Nodes(const std::vector<int64_t>& key_of_rank) {
  std::map<int64_t, int> node_of_key;  // in order of first rank
  node_of_.resize(key_of_rank.size());
  for (size_t r = 0; r < key_of_rank.size(); ++r) {
    auto [it, added] = node_of_key.try_emplace(key_of_rank[r], static_cast<int>(ranks_.size()));
    if (added) ranks_.emplace_back();
    node_of_[r] = it->second;
    ranks_[static_cast<size_t>(it->second)].push_back(static_cast<int>(r));
  }
}

std::vector<int> Nodes::CopyHolders(int rank, int copies) const {
  std::vector<int> holders;
  const int node = node_of(rank);
  const std::vector<int>& mine = ranks_of(node);
  const auto position = std::find(mine.begin(), mine.end(), rank) - mine.begin();
  for (int k = 1; k <= std::min(copies, count() - 1); ++k) {
    const std::vector<int>& other = ranks_of((node + k) % count());
    holders.push_back(other[static_cast<size_t>(position) % other.size()]);
  }
  return holders;
}

std::vector<int> Nodes::CopiesHeldBy(int rank, int copies) const {
  std::vector<int> held;
  for (int r = 0; r < static_cast<int>(node_of_.size()); ++r) {
    for (int h : CopyHolders(r, copies)) {
      if (h == rank) held.push_back(r);
    }
  }
  return held;
}

// ---- WriterFiles ----

WriterFiles::WriterFiles(const io::Marker& m) : bytes(static_cast<size_t>(m.world_size), 0) {
  offset.resize(m.arrays.size());
  for (size_t ai = 0; ai < m.arrays.size(); ++ai) {
    const io::MarkerArray& a = m.arrays[ai];
    offset[ai].resize(a.boxes.size());
    for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
      const auto w = static_cast<size_t>(a.boxes[bi].writer);
      if (w >= bytes.size()) bytes.resize(w + 1, 0);
      offset[ai][bi] = bytes[w];
      bytes[w] += BoxBytes(a.boxes[bi].box, a.dtype);
    }
  }
}

std::string WriterFileName(int writer) { return fmt::format("w{}.bin", writer); }

// ---- LocalTier ----

LocalTier::LocalTier(const Options& options)
    : dir_(options.local_dir),
      copies_(options.local_copies),
      keep_(options.local_max_to_keep),
      store_(io::MakeRootStore(options.local_dir)) {}

LocalTier::~LocalTier() = default;

std::string LocalTier::FilePath(int64_t step, int writer) const {
  return io::StepDir(dir_, step) + "/" + WriterFileName(writer);
}

Status LocalTier::Open(const Comm& comm, const Options& options) {
  nodes_ = Nodes::Discover(comm, options.node_id);
  const int rank = comm.rank();
  const bool leader = nodes_.leads(rank);
  std::vector<int64_t> report;  // per step: step, hash, world size, created, n, n writers
  std::map<int64_t, std::string> texts;
  Status s;
  if (leader) {
    s = Guarded(fmt::format("rank {}: local dir '{}'", rank, dir_), [&]() -> Status {
      MHCKPT_RETURN_IF_ERROR(store_->Create());
      MHCKPT_RETURN_IF_ERROR(store_->CheckWritable());
      MHCKPT_ASSIGN_OR_RETURN(ownership_,
                              store_->Acquire({options.root_lease_seconds, options.root_wait_seconds}));
      MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> garbage, store_->StepsWithoutMarker());
      for (int64_t g : garbage) MHCKPT_RETURN_IF_ERROR(store_->RemoveStep(g));
      MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> retired, store_->RetiredSteps());
      for (const std::string& r : retired) MHCKPT_RETURN_IF_ERROR(store_->RemoveRetired(r));
      MHCKPT_ASSIGN_OR_RETURN(std::vector<io::StepEntry> steps, store_->ListSteps());
      for (const io::StepEntry& e : steps) {
        if (!e.committed) {
          Logger()->warn("mhckpt: local step {} in '{}' is damaged, removed: {}", e.step, dir_,
                         e.marker.ToString());
          MHCKPT_RETURN_IF_ERROR(store_->RemoveStep(e.step));
          continue;
        }
        MHCKPT_ASSIGN_OR_RETURN(std::string text, store_->GetMarker(e.step));
        MHCKPT_ASSIGN_OR_RETURN(io::Marker m, store_->ReadMarker(e.step));
        const WriterFiles files(m);
        std::vector<int64_t> held;
        for (int w = 0; w < m.world_size; ++w) {
          Result<uint64_t> size = io::MappedFile::Size(FilePath(e.step, w));
          if (size.ok() && *size == files.bytes[static_cast<size_t>(w)]) held.push_back(w);
        }
        report.insert(report.end(), {e.step, TextHash(text), m.world_size, m.created_unix_ms,
                                     static_cast<int64_t>(held.size())});
        report.insert(report.end(), held.begin(), held.end());
        texts[e.step] = std::move(text);
      }
      return OkStatus();
    });
    if (!s.ok() && s.message().rfind("rank ", 0) != 0) {
      s = Status(s.code(), fmt::format("rank {}: local dir '{}': {}", rank, dir_, s.message()));
    }
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm));

  // Rank 0: the steps whose every writer file survives on some node. Nodes
  // may hold different saves of one step: a job that could not restore a
  // local step (its nodes lacked some of the step's files) saves that step
  // number again, while a node outside that job keeps the older save. The
  // newest save (by its marker's creation time) is the step, restorable if
  // it is whole; nodes remove the others below.
  std::vector<std::string> reports = comm.GatherBytes(EncodeValues(report), 0);
  std::vector<int64_t> view;  // n, then per step: step, source rank, per writer: n, nodes
  if (rank == 0) {
    struct Save {
      int world_size = 0;
      int64_t created = 0;
      int source = -1;
      std::map<int, std::vector<int>> nodes_of_writer;
    };
    std::map<int64_t, std::map<int64_t, Save>> seen;  // step -> marker hash -> save
    for (int r = 0; r < comm.size(); ++r) {
      std::vector<int64_t> v = DecodeValues(reports[static_cast<size_t>(r)]);
      for (size_t i = 0; i + 5 <= v.size();) {
        const int64_t step = v[i], hash = v[i + 1];
        const auto n = static_cast<size_t>(v[i + 4]);
        Save& e = seen[step][hash];
        if (e.source < 0) {
          e.world_size = static_cast<int>(v[i + 2]);
          e.created = v[i + 3];
          e.source = r;
        }
        for (size_t k = 0; k < n && i + 5 + k < v.size(); ++k) {
          e.nodes_of_writer[static_cast<int>(v[i + 5 + k])].push_back(nodes_.node_of(r));
        }
        i += 5 + n;
      }
    }
    std::vector<int64_t> whole;
    std::map<int64_t, const Save*> chosen;
    for (const auto& [step, saves] : seen) {
      const Save* newest = nullptr;
      bool tie = false;
      for (const auto& [hash, e] : saves) {
        if (newest == nullptr || e.created > newest->created) {
          newest = &e;
          tie = false;
        } else if (e.created == newest->created) {
          tie = true;
        }
      }
      std::vector<int> lost;
      for (int w = 0; w < newest->world_size; ++w) {
        if (!newest->nodes_of_writer.count(w)) lost.push_back(w);
      }
      if (tie) {
        Logger()->warn(
            "mhckpt: local step {}: nodes hold different saves of it made at the same time; not "
            "restorable",
            step);
      } else if (!lost.empty()) {
        Logger()->info(
            "mhckpt: local step {} cannot be restored: no node of this job holds the boxes of "
            "rank(s) {} (of {} at save)",
            step, fmt::join(lost, ","), newest->world_size);
      } else {
        if (saves.size() > 1) {
          Logger()->warn(
              "mhckpt: local step {}: nodes hold {} different saves of it; the newest is used, "
              "nodes remove the others",
              step, saves.size());
        }
        whole.push_back(step);
        chosen[step] = newest;
      }
    }
    if (static_cast<int>(whole.size()) > keep_) {
      whole.erase(whole.begin(), whole.end() - keep_);
    }
    view.push_back(static_cast<int64_t>(whole.size()));
    for (int64_t step : whole) {
      const Save& e = *chosen.at(step);
      view.insert(view.end(), {step, e.source, e.world_size});
      for (int w = 0; w < e.world_size; ++w) {
        const std::vector<int>& ns = e.nodes_of_writer.at(w);
        view.push_back(static_cast<int64_t>(ns.size()));
        view.insert(view.end(), ns.begin(), ns.end());
      }
    }
    if (seen.size() > 0 && whole.empty()) {
      Logger()->info(
          "mhckpt: the local tier in '{}' holds no step this job can restore; restores use the "
          "shared root",
          dir_);
    }
    if (nodes_.count() == 1) {
      Logger()->warn(
          "mhckpt: the job runs on one node: the local tier has no other node to keep copies on, "
          "so it survives process crashes but not the loss of the node");
    }
  }
  comm.BroadcastValues(&view, 0);

  // The markers of the restorable steps, from a node that holds each. A
  // node that holds another save of a kept step removes it below.
  std::set<int64_t> kept;
  std::set<int64_t> stale;
  Status parsed;
  for (size_t i = 1, n = static_cast<size_t>(view.at(0)), k = 0; k < n; ++k) {
    const int64_t step = view[i];
    const auto source = static_cast<int>(view[i + 1]);
    const auto ws = static_cast<size_t>(view[i + 2]);
    i += 3;
    std::string text = rank == source ? texts[step] : std::string();
    comm.BroadcastBytes(&text, source);
    if (auto mine = texts.find(step); mine != texts.end() && mine->second != text) {
      stale.insert(step);
    }
    auto local = std::make_shared<LocalStep>();
    local->holders.resize(ws);
    for (size_t w = 0; w < ws; ++w) {
      const auto count = static_cast<size_t>(view[i]);
      for (size_t j = 0; j < count; ++j) {
        for (int r : nodes_.ranks_of(static_cast<int>(view[i + 1 + j]))) {
          local->holders[w].push_back(r);
        }
      }
      std::sort(local->holders[w].begin(), local->holders[w].end());
      i += 1 + count;
    }
    Result<io::Marker> m =
        io::ParseMarker(text, fmt::format("local step {} (from rank {})", step, source));
    if (!m.ok()) {
      if (parsed.ok()) parsed = Status(m.status().code(), fmt::format("rank {}: {}", rank,
                                                                       m.status().message()));
      continue;
    }
    local->marker = std::move(m).value();
    kept.insert(step);
    Add(step, std::move(local));
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(parsed, comm));

  // Steps no one can restore take node memory for nothing.
  Status removed;
  if (leader) {
    for (const auto& [step, text] : texts) {
      if (!kept.count(step) || stale.count(step)) removed = store_->RemoveStep(step);
    }
  }
  return AgreeAll(removed, comm);
}

Status LocalTier::Write(const Comm& comm, const io::Marker& plan, const StagedBoxFn& staged,
                        std::vector<BoxSum>* sums) {
  const int rank = comm.rank();
  const int64_t step = plan.step;
  // 1. The step directory on every node.
  Status s = nodes_.leads(rank) ? store_->CreateStep(step) : OkStatus();
  if (!s.ok()) s = Status(s.code(), fmt::format("rank {}: local dir: {}", rank, s.message()));
  if (s.ok()) s = fault::Hit("local_create");
  if (Status agreed = AgreeAll(s, comm); !agreed.ok()) return s.ok() ? agreed : s;

  // 2. This rank's file, and those it receives.
  const WriterFiles files(plan);
  auto bytes_of = [&](int w) {
    return static_cast<size_t>(w) < files.bytes.size() ? files.bytes[static_cast<size_t>(w)] : 0;
  };
  io::MappedFile own;
  s = Guarded(fmt::format("rank {}: local write of step {}", rank, step), [&]() -> Status {
    MHCKPT_ASSIGN_OR_RETURN(own, io::MappedFile::Create(FilePath(step, rank), bytes_of(rank)));
    for (size_t ai = 0; ai < plan.arrays.size(); ++ai) {
      const io::MarkerArray& a = plan.arrays[ai];
      for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
        if (a.boxes[bi].writer != rank) continue;
        std::span<const std::byte> box = staged(ai, bi);
        if (box.data() == nullptr && BoxBytes(a.boxes[bi].box, a.dtype) > 0) {
          return Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                      a.name, BoxToString(a.boxes[bi].box), rank));
        }
        if (!box.empty()) std::memcpy(own.data() + files.offset[ai][bi], box.data(), box.size());
        sums->push_back(BoxChecksums(a, ai, bi, box));
      }
    }
    return fault::Hit("local_write");
  });
  const std::vector<int> holders = nodes_.CopyHolders(rank, copies_);
  const std::vector<int> senders = nodes_.CopiesHeldBy(rank, copies_);
  std::vector<io::MappedFile> copies(senders.size());
  for (size_t i = 0; s.ok() && i < senders.size(); ++i) {
    Result<io::MappedFile> f = io::MappedFile::Create(FilePath(step, senders[i]),
                                                      bytes_of(senders[i]));
    if (f.ok()) {
      copies[i] = std::move(f).value();
    } else {
      s = f.status();
    }
  }
  if (!s.ok() && s.message().rfind("rank ", 0) != 0) {
    s = Status(s.code(), fmt::format("rank {}: local tier: {}", rank, s.message()));
  }
  // Why an agreement: every rank must have its buffers before any copy moves.
  if (Status agreed = AgreeAll(s, comm); !agreed.ok()) return s.ok() ? agreed : s;

  // 3. The copies, point to point.
  std::vector<MPI_Request> requests;
  for (int h : holders) {
    if (bytes_of(rank) > 0) comm.PostSend(own.data(), bytes_of(rank), h, kCopyTag, &requests);
  }
  for (size_t i = 0; i < senders.size(); ++i) {
    if (bytes_of(senders[i]) > 0) {
      comm.PostReceive(copies[i].data(), bytes_of(senders[i]), senders[i], kCopyTag, &requests);
    }
  }
  Comm::WaitAll(&requests);
  s = own.Close();
  for (io::MappedFile& f : copies) {
    Status closed = f.Close();
    if (s.ok()) s = closed;
  }
  if (s.ok()) s = fault::Hit("local_exchange");
  return s;
}

Status LocalTier::Commit(const Comm& comm, const io::Marker& marker, const std::string& text) {
  Status s;
  if (nodes_.leads(comm.rank())) {
    s = store_->SyncStep(marker.step);
    if (s.ok()) s = fault::Hit("before_local_marker");
    if (s.ok()) s = store_->PutMarker(marker, text);
    if (!s.ok()) {
      s = Status(s.code(), fmt::format("rank {}: local marker: {}", comm.rank(), s.message()));
    }
  }
  s = AgreeAll(s, comm);
  if (!s.ok()) {
    Abandon(comm, marker.step);
    return s;
  }
  auto local = std::make_shared<LocalStep>();
  local->marker = marker;
  local->holders.resize(static_cast<size_t>(marker.world_size));
  for (int w = 0; w < marker.world_size; ++w) {
    auto& h = local->holders[static_cast<size_t>(w)];
    std::vector<int> with_file = nodes_.CopyHolders(w, copies_);
    with_file.push_back(w);
    for (int r : with_file) {
      const std::vector<int>& rs = nodes_.ranks_of(nodes_.node_of(r));
      h.insert(h.end(), rs.begin(), rs.end());
    }
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
  }
  Add(marker.step, std::move(local));
  Keep(comm);
  return OkStatus();
}

void LocalTier::Abandon(const Comm& comm, int64_t step) {
  if (nodes_.leads(comm.rank())) store_->RemoveStep(step).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    view_.erase(step);
  }
}

void LocalTier::Keep(const Comm& comm) {
  std::vector<int64_t> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(view_.size()) > keep_) {
      drop.push_back(view_.begin()->first);
      view_.erase(view_.begin());
    }
  }
  if (!nodes_.leads(comm.rank())) return;
  for (int64_t step : drop) {
    Status s = store_->DeleteStep(step);
    if (!s.ok()) Logger()->warn("mhckpt: local step {}: {}", step, s.ToString());
  }
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
