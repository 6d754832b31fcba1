// Node placement for the local tier (coordinator/local_tier.h): which node
// each rank is on, and from that, where the redundancy of each rank's boxes
// goes. The nodes form a ring, numbered by their lowest rank; a rank's
// partners are the ranks at the same position on the next nodes of the
// ring, and its parity group is the ranks at its position on a run of
// neighbouring nodes. Everything here is a pure function of the ranks'
// node keys, so every rank computes the same placement.
#pragma once

#include <cstdint>
#include <vector>

#include "base/comm.h"

namespace mhckpt::internal {

/// Which node each rank of a communicator is on, and where the copies of
/// each rank's boxes go: a ring over the nodes.
class Nodes {
 public:
  /// Collective. `node_id` >= 0: this rank's node, as given (tests that
  /// simulate nodes); -1: the shared-memory domain (MPI_Comm_split_type).
  static Nodes Discover(const Comm& comm, int node_id);
  /// From each rank's node key (equal keys: one node). Nodes are numbered
  /// by their lowest rank.
  explicit Nodes(const std::vector<int64_t>& key_of_rank);
  Nodes() = default;

  [[nodiscard]] int count() const { return static_cast<int>(ranks_.size()); }
  /// The number of ranks.
  [[nodiscard]] int ranks() const { return static_cast<int>(node_of_.size()); }
  [[nodiscard]] int node_of(int rank) const { return node_of_[static_cast<size_t>(rank)]; }
  [[nodiscard]] const std::vector<int>& ranks_of(int node) const {
    return ranks_[static_cast<size_t>(node)];
  }
  /// True for the lowest rank of its node, which runs the node's local dir.
  [[nodiscard]] bool leads(int rank) const { return ranks_of(node_of(rank)).front() == rank; }
  /// The ranks that keep a copy of `rank`'s boxes: on each of the next
  /// `copies` nodes of the ring (fewer if there are fewer other nodes), the
  /// rank at the same position within its node (modulo the node's size).
  [[nodiscard]] std::vector<int> CopyHolders(int rank, int copies) const;
  /// The ranks whose boxes `rank` keeps a copy of (the inverse).
  [[nodiscard]] std::vector<int> CopiesHeldBy(int rank, int copies) const;
  /// The parity groups for Options::local_parity_group = `g`: the nodes in
  /// runs of g (a last run of one node joins the run before), and in each
  /// run the ranks at the same position on its nodes, in node order, where
  /// there are two or more.
  [[nodiscard]] std::vector<std::vector<int>> ParityGroups(int g) const;
  /// Every rank of the nodes of `ranks`, ascending, each once.
  [[nodiscard]] std::vector<int> RanksOnNodesOf(const std::vector<int>& ranks) const;

 private:
  std::vector<int> node_of_;
  std::vector<std::vector<int>> ranks_;
};

}  // namespace mhckpt::internal
