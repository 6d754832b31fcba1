#include "coordinator/local_recovery.h"

#include <algorithm>
#include <iterator>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/log.h"
#include "coordinator/local_parity.h"
#include "io/mapped_file.h"
#include "io/posix_file.h"

namespace mhckpt::internal {

Result<Deletions> ParseLocalDeletions(const std::string& text, const std::string& origin) {
  try {
    Deletions out;
    const nlohmann::json record = nlohmann::json::parse(text);
    for (const nlohmann::json& e : record.at("deleted")) {
      int64_t& when = out[e.at(0).get<int64_t>()];
      when = std::max(when, e.at(1).get<int64_t>());
    }
    return out;
  } catch (const std::exception& e) {
    return DataLoss(
        fmt::format("the record of deleted local saves '{}' is damaged: {}", origin, e.what()));
  }
}

std::string LocalDeletionsToJson(const Deletions& deleted) {
  nlohmann::json list = nlohmann::json::array();
  auto first = deleted.begin();
  if (deleted.size() > kMaxDeletedSteps) {
    std::advance(first, static_cast<std::ptrdiff_t>(deleted.size() - kMaxDeletedSteps));
  }
  for (auto it = first; it != deleted.end(); ++it) list.push_back({it->first, it->second});
  return nlohmann::json{{"deleted", list}}.dump();
}

nlohmann::json NodeHoldings(const LocalPaths& paths, int64_t step, const io::Marker& m,
                            int64_t hash) {
  const WriterFiles files(m);
  std::vector<int> held, blocks;
  for (int w = 0; w < m.world_size; ++w) {
    Result<uint64_t> size = io::MappedFile::Size(paths.FilePath(step, w));
    if (size.ok() && *size == files.bytes[static_cast<size_t>(w)]) held.push_back(w);
  }
  std::vector<std::vector<int>> groups;
  Result<std::string> text = io::ReadSmallFile(paths.GroupsPath(step), size_t{64} << 20);
  if (text.ok()) {
    try {
      groups = nlohmann::json::parse(*text).get<std::vector<std::vector<int>>>();
    } catch (const std::exception& e) {
      Logger()->warn("mhckpt: local step {}: '{}' is damaged: {}", step, paths.GroupsPath(step),
                     e.what());
      groups.clear();
    }
  }
  for (const std::vector<int>& g : groups) {
    const ParityGroup group(g, files);
    for (int r : g) {
      Result<uint64_t> size = io::MappedFile::Size(paths.ParityPath(step, r));
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

namespace {

// One save of a step, as the nodes report it.
struct Save {
  int world_size = 0;
  int64_t created = 0;
  int source = -1;
  std::vector<std::vector<int>> groups;
  std::map<int, std::vector<int>> file_nodes, block_nodes;  // writer -> nodes holding it
};

// The newest of the saves of one step, or null on a tie.
Save* Newest(std::map<int64_t, Save>& saves) {
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
  return tie ? nullptr : newest;
}

// The rank that rebuilds writer `w`'s file from parity, or -1: `w` is the
// only member of its group without a file, and every other member's block
// survives. The lowest rank of a node holding another member's file.
int Rebuilder(const Nodes& nodes, const Save& s, int w) {
  int rebuilder = -1;
  for (const std::vector<int>& g : s.groups) {
    if (std::find(g.begin(), g.end(), w) == g.end()) continue;
    bool ok = true;
    for (int r : g) ok = ok && (r == w || (s.file_nodes.count(r) && s.block_nodes.count(r)));
    if (ok) rebuilder = nodes.ranks_of(s.file_nodes.at(g[g[0] == w ? 1 : 0]).front()).front();
  }
  return rebuilder;
}

}  // namespace

nlohmann::json ElectRestorable(const Nodes& nodes, const std::vector<std::string>& reports,
                               int keep, const std::string& dir, const Deletions& deleted) {
  std::map<int64_t, std::map<int64_t, Save>> seen;  // step -> marker hash -> save
  for (size_t r = 0; r < reports.size(); ++r) {
    const int node = nodes.node_of(static_cast<int>(r));
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
  auto ranks_of_nodes = [&](const std::vector<int>& ns) {
    std::vector<int> ranks;
    ranks.reserve(ns.size());
    for (int n : ns) ranks.push_back(nodes.ranks_of(n).front());
    return nodes.RanksOnNodesOf(ranks);
  };
  nlohmann::json view = nlohmann::json::array();
  for (auto& [step, saves] : seen) {
    if (auto d = deleted.find(step); d != deleted.end()) {
      const size_t before = saves.size();
      std::erase_if(saves, [&](const auto& e) { return e.second.created <= d->second; });
      if (saves.size() < before) {
        Logger()->info(
            "mhckpt: local step {}: a node that was away when the step was deleted still holds "
            "it; it stays deleted and is removed",
            step);
      }
    }
    if (saves.empty()) continue;
    Save* newest = Newest(saves);
    if (newest == nullptr) {
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
      const int rebuilder = Rebuilder(nodes, s, w);
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
    for (const auto& [w, ns] : s.block_nodes) {
      if (w >= 0 && w < s.world_size) parity_holders[static_cast<size_t>(w)] = ranks_of_nodes(ns);
    }
    view.push_back({{"step", step},
                    {"source", s.source},
                    {"holders", holders},
                    {"parity_holders", parity_holders},
                    {"groups", s.groups},
                    {"rebuild", rebuild}});
  }
  if (static_cast<int>(view.size()) > keep) {
    view.erase(view.begin(), view.end() - keep);
  }
  if (!seen.empty() && view.empty()) {
    Logger()->info(
        "mhckpt: the local tier in '{}' holds no step this job can restore; restores use the "
        "shared root",
        dir);
  }
  return view;
}

}  // namespace mhckpt::internal
