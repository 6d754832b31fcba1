#include "coordinator/local_sources.h"

#include <algorithm>

#include <fmt/format.h>

#include "coordinator/local_parity.h"
#include "coordinator/local_tier.h"

namespace mhckpt::internal {

LocalSources::Source LocalSources::First(int writer, int asker) const {
  const std::vector<int>& holders = s_.holders.at(static_cast<size_t>(writer));
  if (std::binary_search(holders.begin(), holders.end(), asker)) return {asker, false};
  return {holders[static_cast<size_t>(asker) % holders.size()], false};
}

std::optional<LocalSources::Source> LocalSources::Next(int writer, int asker, Source failed,
                                                       const std::string& why, Attempts* a) {
  a->tried.push_back(why);
  if (failed.rebuilt) {
    a->parity_tried = true;
  } else {
    a->bad_nodes.insert(nodes_.node_of(failed.server));
    bad_file_nodes_[writer].insert(nodes_.node_of(failed.server));
  }
  // The asker if its node holds a copy not tried, else one of the ranks of
  // the first such node, picked by the asker's rank.
  const std::vector<int>& holders = s_.holders.at(static_cast<size_t>(writer));
  if (std::binary_search(holders.begin(), holders.end(), asker) &&
      !a->bad_nodes.count(nodes_.node_of(asker))) {
    return Source{asker, false};
  }
  std::map<int, std::vector<int>> by_node;
  for (int r : holders) by_node[nodes_.node_of(r)].push_back(r);
  for (const auto& [node, ranks] : by_node) {
    if (!a->bad_nodes.count(node))
      return Source{ranks[static_cast<size_t>(asker) % ranks.size()], false};
  }
  if (!a->parity_tried && GroupOf(writer) != nullptr) return Source{holders.front(), true};
  return std::nullopt;
}

const std::vector<int>* LocalSources::GroupOf(int w) const {
  return FindParityGroup(s_.parity_groups, w);
}

int LocalSources::HolderOf(int w) const {
  const std::vector<int>& holders = s_.holders.at(static_cast<size_t>(w));
  auto bad = bad_file_nodes_.find(w);
  for (int r : holders) {
    if (bad == bad_file_nodes_.end() || !bad->second.count(nodes_.node_of(r))) return r;
  }
  return holders.front();
}

std::string LocalSources::NoParityReason(int w) const {
  if (GroupOf(w) != nullptr) return "";
  return s_.parity_groups.empty() ? "; no parity is kept"
                                  : fmt::format("; rank {} is in no parity group", w);
}

}  // namespace mhckpt::internal
