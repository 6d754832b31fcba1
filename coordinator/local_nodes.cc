#include "coordinator/local_nodes.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

namespace mhckpt::internal {

Nodes Nodes::Discover(const Comm& comm, int node_id) {
  const int64_t key = node_id >= 0 ? node_id : comm.SharedMemoryLeader();
  const std::vector<std::string> keys =
      comm.AllGatherBytes(std::string(reinterpret_cast<const char*>(&key), sizeof(key)));
  std::vector<int64_t> key_of_rank(keys.size(), 0);
  for (size_t r = 0; r < keys.size(); ++r) {
    if (keys[r].size() >= sizeof(int64_t)) {
      std::memcpy(&key_of_rank[r], keys[r].data(), sizeof(int64_t));
    }
  }
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
  for (int r = 0; r < ranks(); ++r) {
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

std::vector<int> Nodes::RanksOnNodesOf(const std::vector<int>& ranks) const {
  std::vector<int> out;
  for (int r : ranks) {
    const std::vector<int>& rs = ranks_of(node_of(r));
    out.insert(out.end(), rs.begin(), rs.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace mhckpt::internal
