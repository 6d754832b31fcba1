// Helpers shared by the tests of the local tier (local_tier_test,
// fallback_test): nodes simulated on one machine and the arrays each rank
// saves at a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"
#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt::testing {

// Ranks are put on nodes with Options::node_id: 2 ranks per node at 4 ranks,
// 1 otherwise.
inline int RanksPerNode(int size) { return size == 4 ? 2 : 1; }
inline int NodeOf(int rank, int size) { return rank / RanksPerNode(size); }
inline int NodeCount(int size) { return (size + RanksPerNode(size) - 1) / RanksPerNode(size); }

// The shape of array "w".
inline const std::vector<int64_t> kShape{37, 5};

// Rows of kShape for `part` of `parts`.
inline Box Rows(int parts, int part) {
  auto [b, e] = SplitRange(kShape[0], parts, part);
  return Box{{b, 0}, {e - b, kShape[1]}};
}

// What each rank saves at `step`: its rows of "w" and all of "r" (written by
// rank 0, into w0.bin of a local step).
struct Step {
  std::vector<std::byte> w, r;
  std::vector<ArrayToSave> arrays;
  Step(int64_t step, int rank, int size) {
    const auto seed = static_cast<uint64_t>(step);
    w = Fill(DType::kFloat32, kShape, Rows(size, rank), seed);
    r = Fill(DType::kInt64, {11}, FullBox({11}), seed + 100);
    arrays.push_back({"w", DType::kFloat32, kShape, {Shard{Rows(size, rank), w.data()}}});
    arrays.push_back({"r", DType::kInt64, {11}, {Shard{FullBox({11}), r.data()}}});
  }
};

}  // namespace mhckpt::testing

// The tests of the local tier (local_tier_test, fallback_test) live in this
// namespace, with the helpers they share in scope.
namespace mhckpt::tiers_test {

using testing::Fill;
using testing::FreshDir;
using testing::kShape;
using testing::NodeCount;
using testing::NodeOf;
using testing::Rank;
using testing::RanksPerNode;
using testing::Rows;
using testing::SameOnAllRanks;
using testing::Size;
using testing::Step;

}  // namespace mhckpt::tiers_test
