// The plan round without piling every description on rank 0: ranks that hold
// the same arrays and boxes (data-parallel replicas of one model-parallel
// shard) have the same encoded description, so each rank first sends a digest
// of it; only the lowest rank of each distinct digest then sends the
// description itself, and BuildPlan takes the distinct ones and which rank
// described which. At 8,000 ranks of 10,000 arrays this moves and decodes
// tens of descriptions instead of 8,000 (docs/SCALE.md).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "io/marker.h"

namespace mhckpt::internal {

/// What a rank sends instead of its encoded description: its XXH3-128 and
/// length (24 bytes). Two different descriptions share one with a chance
/// of about ranks^2 / 2^129.
std::string LayoutDigest(const std::string& encoded);

struct LayoutGroups {
  std::vector<int> layout_of_rank;  ///< index = rank: which distinct layout it holds
  std::vector<int> first_rank;      ///< index = layout: the lowest rank holding it (its sender)
};

/// Groups ranks by their digests (index = rank), layouts numbered in order of
/// their first rank.
LayoutGroups GroupLayouts(const std::vector<std::string>& digests);

/// Rank 0: decodes the descriptions the senders sent (`encoded`, index =
/// rank; other ranks' entries are ignored) and plans (BuildPlan).
Result<io::Marker> PlanLayouts(const std::vector<std::string>& encoded, const LayoutGroups& groups,
                               uint64_t replica_parallel_min_bytes, uint64_t chunk_bytes);

}  // namespace mhckpt::internal
