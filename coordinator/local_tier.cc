#include "coordinator/local_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/retention.h"
#include "io/layout.h"
#include "io/mapped_file.h"
#include "io/posix_file.h"

namespace mhckpt::internal {
namespace {

// The tags of the copies of writer files, the parity segments and the
// pieces of a rebuild (point to point, on the I/O thread's communicator,
// between two agreements: nothing else is in flight).
constexpr int kCopyTag = 7101;
constexpr int kParityTag = 7103;
constexpr int kRebuildTag = 7104;

void XorInto(char* acc, const char* in, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) acc[i] = static_cast<char>(acc[i] ^ in[i]);
}

// One node's report at recovery: for each committed step, the hash of its
// marker text, the world size at save, and the writers whose files it holds
// whole. Encoded as int64 values in a string.
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

std::vector<std::vector<int>> Nodes::ParityGroups(int g) const {
  std::vector<std::vector<int>> runs;  // of nodes
  for (int n = 0; n < count(); n += g) {
    runs.emplace_back();
    for (int m = n; m < std::min(n + g, count()); ++m) runs.back().push_back(m);
  }
  if (runs.size() > 1 && runs.back().size() == 1) {
    runs[runs.size() - 2].push_back(runs.back().front());
    runs.pop_back();
  }
  std::vector<std::vector<int>> groups;
  for (const std::vector<int>& run : runs) {
    size_t widest = 0;
    for (int n : run) widest = std::max(widest, ranks_of(n).size());
    for (size_t p = 0; p < widest; ++p) {
      std::vector<int> members;
      for (int n : run) {
        if (p < ranks_of(n).size()) members.push_back(ranks_of(n)[p]);
      }
      if (members.size() >= 2) groups.push_back(std::move(members));
    }
  }
  return groups;
}

// ---- ParityGroup ----

ParityGroup::ParityGroup(std::vector<int> ranks, const WriterFiles& files)
    : members(std::move(ranks)) {
  uint64_t widest = 0;
  for (int r : members) {
    if (r >= 0 && static_cast<size_t>(r) < files.bytes.size()) {
      widest = std::max(widest, files.bytes[static_cast<size_t>(r)]);
    }
  }
  const auto parts = static_cast<uint64_t>(std::max(size() - 1, 1));
  segment = (widest + parts - 1) / parts;
}

int ParityGroup::IndexOf(int rank) const {
  auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
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
std::string ParityFileName(int rank) { return fmt::format("p{}.bin", rank); }

// ---- LocalTier ----

LocalTier::LocalTier(const Options& options)
    : dir_(options.local_dir),
      copies_(options.local_parity_group > 0 ? 0 : options.local_copies),
      parity_(options.local_parity_group),
      keep_(options.local_max_to_keep),
      store_(io::MakeRootStore(options.local_dir)) {}

LocalTier::~LocalTier() = default;

std::string LocalTier::FilePath(int64_t step, int writer) const {
  return io::StepDir(dir_, step) + "/" + WriterFileName(writer);
}

std::string LocalTier::ParityPath(int64_t step, int rank) const {
  return io::StepDir(dir_, step) + "/" + ParityFileName(rank);
}

std::string LocalTier::GroupsPath(int64_t step) const {
  return io::StepDir(dir_, step) + "/parity.json";
}

Status LocalTier::Open(const Comm& comm, const Options& options) {
  nodes_ = Nodes::Discover(comm, options.node_id);
  const int rank = comm.rank();
  const bool leader = nodes_.leads(rank);
  // The node's report: per committed step, its marker's hash, the world size
  // at save, the files it holds whole (writer files, parity blocks) and the
  // parity groups of the save.
  nlohmann::json report = nlohmann::json::array();
  std::map<int64_t, std::string> texts;
  Status s;
  if (leader) {
    s = Guarded(fmt::format("rank {}: local dir '{}'", rank, dir_), [&]() -> Status {
      MHCKPT_RETURN_IF_ERROR(store_->Create());
      MHCKPT_RETURN_IF_ERROR(store_->CheckWritable());
      MHCKPT_ASSIGN_OR_RETURN(
          ownership_, store_->Acquire({options.root_lease_seconds, options.root_wait_seconds}));
      MHCKPT_RETURN_IF_ERROR(fault::Hit("local_open"));
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
        report.push_back(Holdings(e.step, m, TextHash(text)));
        texts[e.step] = std::move(text);
      }
      return OkStatus();
    });
    if (!s.ok() && s.message().rfind("rank ", 0) != 0) {
      s = Status(s.code(), fmt::format("rank {}: local dir '{}': {}", rank, dir_, s.message()));
    }
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm));

  std::vector<std::string> reports = comm.GatherBytes(leader ? report.dump() : "[]", 0);
  std::string view_text;
  if (rank == 0) {
    s = Guarded("rank 0: local tier recovery", [&] { view_text = Recover(reports).dump(); });
  }
  // Why: only rank 0 decided; every rank must see its outcome.
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, comm));
  comm.BroadcastBytes(&view_text, 0);
  const nlohmann::json view = nlohmann::json::parse(view_text);

  // The markers of the restorable steps, from a node that holds each, and
  // the files of lost ranks rebuilt from parity.
  std::set<int64_t> kept, stale;
  Status local;
  for (const nlohmann::json& v : view) {
    const auto step = v.at("step").get<int64_t>();
    const int source = v.at("source").get<int>();
    std::string text = rank == source ? texts[step] : std::string();
    comm.BroadcastBytes(&text, source);
    // This node holds another (older) save of the step: removed below.
    if (auto mine = texts.find(step); mine != texts.end() && mine->second != text) {
      stale.insert(step);
    }
    auto ls = std::make_shared<LocalStep>();
    ls->holders = v.at("holders").get<std::vector<std::vector<int>>>();
    ls->parity_groups = v.at("groups").get<std::vector<std::vector<int>>>();
    Result<io::Marker> m =
        io::ParseMarker(text, fmt::format("local step {} (from rank {})", step, source));
    if (m.ok()) {
      ls->marker = std::move(m).value();
    } else if (local.ok()) {
      local = Status(m.status().code(), fmt::format("rank {}: {}", rank, m.status().message()));
    }
    const auto parity_holders = v.at("parity_holders").get<std::vector<std::vector<int>>>();
    for (const auto& r : v.at("rebuild")) {
      const int lost = r.at(0).get<int>(), rebuilder = r.at(1).get<int>();
      Status rebuilt = Rebuild(comm, *ls, lost, rebuilder, parity_holders);
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
      if (!kept.count(step) || stale.count(step)) removed = store_->RemoveStep(step);
    }
  }
  return AgreeAll(removed, comm);
}

// A node's report of one committed local step: what it holds whole.
nlohmann::json LocalTier::Holdings(int64_t step, const io::Marker& m, int64_t hash) const {
  const WriterFiles files(m);
  std::vector<int> held, blocks;
  for (int w = 0; w < m.world_size; ++w) {
    Result<uint64_t> size = io::MappedFile::Size(FilePath(step, w));
    if (size.ok() && *size == files.bytes[static_cast<size_t>(w)]) held.push_back(w);
  }
  std::vector<std::vector<int>> groups;
  Result<std::string> text = io::ReadSmallFile(GroupsPath(step), size_t{64} << 20);
  if (text.ok()) {
    try {
      groups = nlohmann::json::parse(*text).get<std::vector<std::vector<int>>>();
    } catch (const std::exception& e) {
      Logger()->warn("mhckpt: local step {}: '{}' is damaged: {}", step, GroupsPath(step),
                     e.what());
      groups.clear();
    }
  }
  for (const std::vector<int>& g : groups) {
    const ParityGroup group(g, files);
    for (int r : g) {
      Result<uint64_t> size = io::MappedFile::Size(ParityPath(step, r));
      if (size.ok() && *size == group.segment) blocks.push_back(r);
    }
  }
  return {{"step", step},
          {"hash", hash},
          {"world_size", m.world_size},
          {"created", m.created_unix_ms},
          {"files", held},
          {"blocks", blocks},
          {"groups", groups}};
}

// Rank 0: from every node's report, the steps this job can restore, newest
// `keep_`, each with the holders of every file and the rebuilds it needs.
nlohmann::json LocalTier::Recover(const std::vector<std::string>& reports) const {
  // Nodes may hold different saves of one step number: a job that could not
  // restore a local step (its nodes lacked some of the step's files) saves
  // that step again, while a node outside that job keeps the older save. The
  // newest save (its marker's creation time) is the step, restorable if it
  // is whole; two made at the same time count for neither. Nodes remove the
  // others (Open).
  struct Save {
    int world_size = 0;
    int64_t created = 0;
    int source = -1;
    std::vector<std::vector<int>> groups;
    std::map<int, std::vector<int>> file_nodes, block_nodes;
  };
  std::map<int64_t, std::map<int64_t, Save>> seen;  // step -> marker hash -> save
  for (size_t r = 0; r < reports.size(); ++r) {
    const int node = nodes_.node_of(static_cast<int>(r));
    for (const nlohmann::json& e : nlohmann::json::parse(reports[r])) {
      Save& s = seen[e.at("step").get<int64_t>()][e.at("hash").get<int64_t>()];
      if (s.source < 0) {
        s.world_size = e.at("world_size").get<int>();
        s.created = e.at("created").get<int64_t>();
        s.source = static_cast<int>(r);
        s.groups = e.at("groups").get<std::vector<std::vector<int>>>();
      }
      for (int w : e.at("files")) s.file_nodes[w].push_back(node);
      for (int w : e.at("blocks")) s.block_nodes[w].push_back(node);
    }
  }
  auto ranks_of_nodes = [&](const std::vector<int>& nodes) {
    std::vector<int> ranks;
    for (int n : nodes)
      ranks.insert(ranks.end(), nodes_.ranks_of(n).begin(), nodes_.ranks_of(n).end());
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  };
  nlohmann::json view = nlohmann::json::array();
  for (auto& [step, saves] : seen) {
    Save* newest = nullptr;
    bool tie = false;
    for (auto& [hash, e] : saves) {
      if (newest == nullptr || e.created > newest->created) {
        newest = &e;
        tie = false;
      } else if (e.created == newest->created) {
        tie = true;
      }
    }
    if (tie) {
      Logger()->warn(
          "mhckpt: local step {}: nodes hold different saves of it made at the same time; not "
          "restorable",
          step);
      continue;
    }
    Save& s = *newest;
    std::vector<int> lost;
    nlohmann::json rebuild = nlohmann::json::array();
    for (int w = 0; w < s.world_size; ++w) {
      if (s.file_nodes.count(w)) continue;
      // Parity: w is the only member of its group without a file, and every
      // other member's block survives.
      int rebuilder = -1;
      for (const std::vector<int>& g : s.groups) {
        if (std::find(g.begin(), g.end(), w) == g.end()) continue;
        bool ok = true;
        for (int r : g) ok = ok && (r == w || (s.file_nodes.count(r) && s.block_nodes.count(r)));
        if (ok) rebuilder = nodes_.ranks_of(s.file_nodes.at(g[g[0] == w ? 1 : 0]).front()).front();
      }
      if (rebuilder < 0) {
        lost.push_back(w);
      } else {
        rebuild.push_back({w, rebuilder});
      }
    }
    if (!lost.empty()) {
      Logger()->info(
          "mhckpt: local step {} cannot be restored: no node of this job holds the boxes of "
          "rank(s) {} (of {} at save)",
          step, fmt::join(lost, ","), s.world_size);
      continue;
    }
    if (saves.size() > 1) {
      Logger()->warn(
          "mhckpt: local step {}: nodes hold {} different saves of it; the newest is used, nodes "
          "remove the others",
          step, saves.size());
    }
    std::vector<std::vector<int>> holders(static_cast<size_t>(s.world_size));
    for (int w = 0; w < s.world_size; ++w) {
      if (s.file_nodes.count(w)) holders[static_cast<size_t>(w)] = ranks_of_nodes(s.file_nodes[w]);
    }
    std::vector<std::vector<int>> parity_holders(static_cast<size_t>(s.world_size));
    for (const auto& [w, nodes] : s.block_nodes) {
      if (w >= 0 && w < s.world_size)
        parity_holders[static_cast<size_t>(w)] = ranks_of_nodes(nodes);
    }
    view.push_back({{"step", step},
                    {"source", s.source},
                    {"holders", holders},
                    {"parity_holders", parity_holders},
                    {"groups", s.groups},
                    {"rebuild", rebuild}});
  }
  if (static_cast<int>(view.size()) > keep_) {
    view.erase(view.begin(), view.end() - keep_);
  }
  if (!seen.empty() && view.empty()) {
    Logger()->info(
        "mhckpt: the local tier in '{}' holds no step this job can restore; restores use the "
        "shared root",
        dir_);
  }
  if (nodes_.count() == 1) {
    Logger()->warn(
        "mhckpt: the job runs on one node: the local tier has no other node to keep copies or "
        "parity on, so it survives process crashes but not the loss of the node");
  } else if (const std::vector<int> alone = Unprotected(); !alone.empty()) {
    Logger()->warn(
        "mhckpt: rank(s) {} of {} have no parity group (alone at their position on nodes of "
        "unequal size): their boxes are kept on their own node only, so a local step does not "
        "survive the loss of that node",
        fmt::join(alone, ","), nodes_.ranks());
  }
  return view;
}

// One lost rank's file, rebuilt from its group's parity on `rebuilder`: for
// each of its segments, the block that holds it XOR the other segments in
// that block, each sent by the lowest rank holding it.
Status LocalTier::Rebuild(const Comm& comm, const LocalStep& s, int lost, int rebuilder,
                          const std::vector<std::vector<int>>& parity_holders) {
  const int rank = comm.rank();
  const WriterFiles files(s.marker);
  const std::vector<int>* members = nullptr;
  for (const std::vector<int>& g : s.parity_groups) {
    if (std::find(g.begin(), g.end(), lost) != g.end()) members = &g;
  }
  if (members == nullptr) return Internal(fmt::format("rank {} has no parity group", lost));
  const ParityGroup group(*members, files);
  const int li = group.IndexOf(lost);
  const uint64_t seg = group.segment;
  const int64_t step = s.marker.step;
  Status local;
  std::map<std::string, io::MappedFile> mapped;
  // The `seg` bytes at `k * seg` of `path` (zero past its end), or zeros.
  auto piece = [&](const std::string& path, uint64_t k, std::string* out) {
    out->assign(seg, '\0');
    auto it = mapped.find(path);
    if (it == mapped.end()) {
      Result<io::MappedFile> f = io::MappedFile::OpenForReading(path);
      if (!f.ok()) {
        if (local.ok()) local = f.status();
        return;
      }
      it = mapped.emplace(path, std::move(f).value()).first;
    }
    const uint64_t at = k * seg;
    if (at < it->second.size()) {
      std::memcpy(out->data(), it->second.data() + at, std::min(seg, it->second.size() - at));
    }
  };
  io::MappedFile out;
  if (rank == rebuilder) {
    Result<io::MappedFile> f =
        io::MappedFile::Create(FilePath(step, lost), files.bytes[static_cast<size_t>(lost)]);
    if (f.ok()) {
      out = std::move(f).value();
    } else {
      local = f.status();
    }
  }
  std::string acc, buf;
  for (int k = 0; k + 1 < group.size(); ++k) {
    const int bi = group.BlockOf(li, k);
    // The pieces XORed into segment k: member bi's block, and the segments
    // of the other members in it.
    std::vector<std::pair<std::string, std::pair<int, uint64_t>>> pieces;  // path, (source, k)
    const int block = group.members[static_cast<size_t>(bi)];
    pieces.push_back(
        {ParityPath(step, block), {parity_holders.at(static_cast<size_t>(block)).front(), 0}});
    for (int i = 0; i < group.size(); ++i) {
      if (i == li || i == bi) continue;
      const int m = group.members[static_cast<size_t>(i)];
      pieces.push_back({FilePath(step, m),
                        {s.holders.at(static_cast<size_t>(m)).front(),
                         static_cast<uint64_t>(group.SegmentIn(i, bi))}});
    }
    if (rank == rebuilder) acc.assign(seg, '\0');
    for (const auto& [path, where] : pieces) {
      const int source = where.first;
      if (rank != source && rank != rebuilder) continue;
      if (rank == source) piece(path, where.second, &buf);
      if (source != rebuilder) {
        std::vector<MPI_Request> requests;
        if (rank == source) comm.PostSend(buf.data(), seg, rebuilder, kRebuildTag, &requests);
        if (rank == rebuilder) {
          buf.resize(seg);
          comm.PostReceive(buf.data(), seg, source, kRebuildTag, &requests);
        }
        Comm::WaitAll(&requests);
      }
      if (rank == rebuilder) XorInto(acc.data(), buf.data(), seg);
    }
    if (rank == rebuilder && out.data() != nullptr) {
      const uint64_t at = static_cast<uint64_t>(k) * seg;
      if (at < out.size()) std::memcpy(out.data() + at, acc.data(), std::min(seg, out.size() - at));
    }
  }
  Status closed = out.Close();
  if (local.ok()) local = closed;
  if (rank == rebuilder && local.ok()) {
    Logger()->info("mhckpt: local step {}: rank {}'s boxes rebuilt from parity on rank {}", step,
                   lost, rebuilder);
  }
  if (!local.ok()) {
    local = Status(local.code(), fmt::format("rank {}: rebuilding rank {}'s file of local step "
                                             "{} from parity: {}",
                                             rank, lost, step, local.message()));
  }
  return local;
}

Status LocalTier::Write(const Comm& comm, const io::Marker& plan, const StagedBoxFn& staged,
                        std::vector<BoxSum>* sums) {
  const int rank = comm.rank();
  const int64_t step = plan.step;
  // 1. The step directory on every node: the spare, recycled (its files keep
  // their pages), or a fresh one. No committed step is touched.
  Status s;
  if (nodes_.leads(rank)) s = MakeStepDir(rank, step);
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
        sums->push_back(BoxChecksums(a, ai, bi, box));
      }
    }
    // Written (one copy, into pages the write allocates: a full tmpfs is
    // ENOSPC here), then mapped to send.
    MHCKPT_ASSIGN_OR_RETURN(
        own, io::MappedFile::CreateByWrites(FilePath(step, rank), bytes_of(rank), pieces));
    return fault::Hit("local_write");
  });
  const std::vector<int> holders = nodes_.CopyHolders(rank, copies_);
  const std::vector<int> senders = nodes_.CopiesHeldBy(rank, copies_);
  std::vector<io::MappedFile> copies(senders.size());
  for (size_t i = 0; s.ok() && i < senders.size(); ++i) {
    Result<io::MappedFile> f =
        io::MappedFile::Create(FilePath(step, senders[i]), bytes_of(senders[i]));
    if (f.ok()) {
      copies[i] = std::move(f).value();
    } else {
      s = f.status();
    }
  }
  // With parity: this rank's block, and the group it is in.
  const std::vector<std::vector<int>> groups =
      parity_ > 0 ? nodes_.ParityGroups(parity_) : std::vector<std::vector<int>>();
  std::optional<ParityGroup> group;
  for (const std::vector<int>& g : groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) group.emplace(g, files);
  }
  io::MappedFile block;
  if (s.ok() && group && group->segment > 0) {
    Result<io::MappedFile> f = io::MappedFile::Create(ParityPath(step, rank), group->segment);
    if (f.ok()) {
      block = std::move(f).value();
      std::memset(block.data(), 0, block.size());  // the XOR of the segments goes into it
    } else {
      s = f.status();
    }
  }
  if (!s.ok() && s.message().rfind("rank ", 0) != 0) {
    s = Status(s.code(), fmt::format("rank {}: local tier: {}", rank, s.message()));
  }
  // Why an agreement: every rank must have its buffers before any copy moves.
  if (Status agreed = AgreeAll(s, comm); !agreed.ok()) return s.ok() ? agreed : s;

  // 3. The copies (or parity segments), point to point.
  std::vector<MPI_Request> requests;
  std::vector<std::string> parity_in, parity_out;
  if (group && group->segment > 0) {
    // Segment k of this rank goes to the block of member (i+1+k) mod g; the
    // other members' segments for this rank's block arrive.
    const int me = group->IndexOf(rank);
    const uint64_t seg = group->segment;
    parity_out.resize(static_cast<size_t>(group->size() - 1));
    parity_in.resize(parity_out.size());
    for (int k = 0; k + 1 < group->size(); ++k) {
      std::string& out = parity_out[static_cast<size_t>(k)];
      out.assign(seg, '\0');
      const uint64_t at = static_cast<uint64_t>(k) * seg;
      if (at < own.size()) std::memcpy(out.data(), own.data() + at, std::min(seg, own.size() - at));
      const int to = group->members[static_cast<size_t>(group->BlockOf(me, k))];
      comm.PostSend(out.data(), seg, to, kParityTag, &requests);
    }
    for (int i = 0, n = 0; i < group->size(); ++i) {
      if (i == me) continue;
      std::string& in = parity_in[static_cast<size_t>(n++)];
      in.resize(seg);
      comm.PostReceive(in.data(), seg, group->members[static_cast<size_t>(i)], kParityTag,
                       &requests);
    }
  }
  for (int h : holders) {
    if (bytes_of(rank) > 0) comm.PostSend(own.data(), bytes_of(rank), h, kCopyTag, &requests);
  }
  for (size_t i = 0; i < senders.size(); ++i) {
    if (bytes_of(senders[i]) > 0) {
      comm.PostReceive(copies[i].data(), bytes_of(senders[i]), senders[i], kCopyTag, &requests);
    }
  }
  Comm::WaitAll(&requests);
  for (const std::string& in : parity_in) {
    XorInto(reinterpret_cast<char*>(block.data()), in.data(), in.size());
  }
  s = own.Close();
  if (Status closed = block.Close(); s.ok()) s = closed;
  for (io::MappedFile& f : copies) {
    Status closed = f.Close();
    if (s.ok()) s = closed;
  }
  // The bytes of every file this rank wrote durable before its node's marker
  // (step 4; a no-op on a tmpfs).
  if (s.ok()) s = io::FsyncFile(FilePath(step, rank));
  for (size_t i = 0; s.ok() && i < senders.size(); ++i)
    s = io::FsyncFile(FilePath(step, senders[i]));
  if (s.ok() && group && group->segment > 0) s = io::FsyncFile(ParityPath(step, rank));
  if (s.ok()) s = fault::Hit("local_exchange");
  return s;
}

Status LocalTier::Commit(const Comm& comm, const io::Marker& marker, const std::string& text) {
  Status s;
  const std::vector<std::vector<int>> groups =
      parity_ > 0 ? nodes_.ParityGroups(parity_) : std::vector<std::vector<int>>();
  if (nodes_.leads(comm.rank())) {
    // The parity groups of the save, for a rebuild after the nodes changed.
    if (!groups.empty())
      s = io::WriteFileAtomic(GroupsPath(marker.step), nlohmann::json(groups).dump());
    if (s.ok()) s = store_->SyncStep(marker.step);
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
  local->parity_groups = groups;
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

// The node's lowest rank: the spare (a retired directory, no marker, out of
// the listing) becomes the directory of `new_step`, and the files this node
// will not write again are removed: what is left is overwritten in place.
// Without a spare, a fresh directory. A crash in between leaves a step
// directory without a marker, which Open removes.
Status LocalTier::MakeStepDir(int rank, int64_t new_step) {
  const std::string to = io::StepDir(dir_, new_step);
  if (io::PathExists(io::MarkerPath(dir_, new_step))) {
    return AlreadyExists(fmt::format("local step {} is committed in '{}'", new_step, dir_));
  }
  const std::string from = std::exchange(spare_, std::string());
  if (from.empty() || !io::PathExists(from)) return store_->CreateStep(new_step);
  MHCKPT_RETURN_IF_ERROR(io::RemoveAll(to));
  MHCKPT_RETURN_IF_ERROR(io::Rename(from, to));
  MHCKPT_RETURN_IF_ERROR(io::FsyncDir(dir_));
  std::set<std::string> writes;
  for (int r : nodes_.ranks_of(nodes_.node_of(rank))) {
    writes.insert(WriterFileName(r));
    if (parity_ > 0) writes.insert(ParityFileName(r));
    for (int sender : nodes_.CopiesHeldBy(r, copies_)) writes.insert(WriterFileName(sender));
  }
  MHCKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, io::ListDir(to));
  for (const std::string& name : names) {
    if (!writes.count(name)) MHCKPT_RETURN_IF_ERROR(io::RemoveAll(fmt::format("{}/{}", to, name)));
  }
  return OkStatus();
}

void LocalTier::Abandon(const Comm& comm, int64_t step) {
  if (nodes_.leads(comm.rank())) store_->RemoveStep(step).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    view_.erase(step);
  }
}

// Save step 5, after an agreed commit: the steps past the newest keep_ leave
// the view unless held on some rank; the node's lowest rank keeps the first
// it drops as the spare of the next save's step 1 and removes the rest.
void LocalTier::Keep(const Comm& comm) {
  std::vector<int64_t> past, held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto extra = static_cast<int64_t>(view_.size()) - keep_;
    for (auto it = view_.begin(); extra > 0; ++it, --extra) {
      past.push_back(it->first);
      held.push_back(holds_.count(it->first) > 0 ? 1 : 0);
    }
  }
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
  for (int64_t step : drop) {
    Status s;
    if (spare_.empty()) {
      Result<std::string> retired = store_->RetireStep(step);
      s = retired.status();
      if (retired.ok()) spare_ = std::move(retired).value();
    } else {
      s = store_->DeleteStep(step);
    }
    if (!s.ok()) Logger()->warn("mhckpt: local step {}: {}", step, s.ToString());
  }
}

LocalTier::Hold& LocalTier::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Release();
    tier_ = std::exchange(o.tier_, nullptr);
    step_ = o.step_;
  }
  return *this;
}

void LocalTier::Hold::Release() {
  if (tier_ == nullptr) return;
  std::lock_guard<std::mutex> lock(tier_->mu_);
  auto it = tier_->holds_.find(step_);
  if (it != tier_->holds_.end() && --it->second == 0) tier_->holds_.erase(it);
  tier_ = nullptr;
}

LocalTier::Hold LocalTier::HoldStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  ++holds_[step];
  return Hold(this, step);
}

bool LocalTier::IsHeld(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return holds_.count(step) > 0;
}

std::vector<int> LocalTier::Unprotected() const {
  const int world = nodes_.ranks();
  std::vector<bool> covered(static_cast<size_t>(world), false);
  if (parity_ > 0) {
    for (const std::vector<int>& g : nodes_.ParityGroups(parity_)) {
      for (int r : g) covered[static_cast<size_t>(r)] = true;
    }
  } else {
    for (int r = 0; r < world; ++r)
      covered[static_cast<size_t>(r)] = !nodes_.CopyHolders(r, copies_).empty();
  }
  std::vector<int> out;
  for (int r = 0; r < world; ++r) {
    if (!covered[static_cast<size_t>(r)]) out.push_back(r);
  }
  return out;
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
