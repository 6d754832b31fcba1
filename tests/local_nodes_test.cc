// coordinator/local_nodes.h: the placement of the local tier's redundancy on
// a ring of nodes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "coordinator/local_nodes.h"

namespace mhckpt::internal {
namespace {

using Ranks = std::vector<int>;
using Groups = std::vector<std::vector<int>>;

TEST(LocalNodes, NumbersNodesByTheirLowestRank) {
  const Nodes nodes({7, 3, 7, 3, 9});
  EXPECT_EQ(nodes.count(), 3);
  EXPECT_EQ(nodes.ranks(), 5);
  EXPECT_EQ(nodes.ranks_of(0), (Ranks{0, 2}));
  EXPECT_EQ(nodes.ranks_of(1), (Ranks{1, 3}));
  EXPECT_EQ(nodes.ranks_of(2), (Ranks{4}));
  EXPECT_TRUE(nodes.leads(1));
  EXPECT_FALSE(nodes.leads(3));
  EXPECT_EQ(nodes.RanksOnNodesOf({4, 2}), (Ranks{0, 2, 4}));
}

TEST(LocalNodes, CopyHoldersAreTheSamePositionOnTheNextNodes) {
  // Three nodes of two ranks: {0,1} {2,3} {4,5}.
  const Nodes nodes({0, 0, 1, 1, 2, 2});
  EXPECT_EQ(nodes.CopyHolders(1, 1), (Ranks{3}));
  EXPECT_EQ(nodes.CopyHolders(5, 2), (Ranks{1, 3}));
  // No more copies than other nodes.
  EXPECT_EQ(nodes.CopyHolders(0, 5), (Ranks{2, 4}));
  EXPECT_EQ(nodes.CopyHolders(0, 0), Ranks{});
  // The inverse.
  EXPECT_EQ(nodes.CopiesHeldBy(3, 1), (Ranks{1}));
  EXPECT_EQ(nodes.CopiesHeldBy(0, 2), (Ranks{2, 4}));
}

TEST(LocalNodes, CopyHoldersWrapOnASmallerNode) {
  // Nodes {0,1,2} and {3}: every rank of node 0 copies to rank 3.
  const Nodes nodes({0, 0, 0, 1});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(nodes.CopyHolders(r, 1), (Ranks{3})) << r;
  EXPECT_EQ(nodes.CopiesHeldBy(3, 1), (Ranks{0, 1, 2}));
  EXPECT_EQ(nodes.CopyHolders(3, 1), (Ranks{0}));
}

TEST(LocalNodes, OneNodeHasNoPartners) {
  const Nodes nodes({4, 4});
  EXPECT_EQ(nodes.CopyHolders(0, 1), Ranks{});
  EXPECT_EQ(nodes.ParityGroups(2), Groups{});
}

TEST(LocalNodes, ParityGroupsAreRunsOfNodesAtOnePosition) {
  // Four nodes of two ranks, groups of 2: runs {0,1} and {2,3}.
  const Nodes four({0, 0, 1, 1, 2, 2, 3, 3});
  EXPECT_EQ(four.ParityGroups(2), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  // Three nodes, groups of 2: the last run of one node joins the one before.
  const Nodes three({0, 1, 2});
  EXPECT_EQ(three.ParityGroups(2), (Groups{{0, 1, 2}}));
  // Nodes of unequal size: a rank alone at its position has no group.
  const Nodes unequal({0, 0, 1});
  EXPECT_EQ(unequal.ParityGroups(2), (Groups{{0, 2}}));
}

}  // namespace
}  // namespace mhckpt::internal
