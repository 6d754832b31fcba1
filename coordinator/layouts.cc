#include "coordinator/layouts.h"

#include <xxhash.h>

#include <cstring>
#include <unordered_map>

#include "coordinator/plan.h"

namespace mhckpt::internal {

std::string LayoutDigest(const std::string& encoded) {
  const XXH128_hash_t h = XXH3_128bits(encoded.data(), encoded.size());
  const uint64_t words[3] = {h.low64, h.high64, encoded.size()};
  std::string digest(sizeof words, '\0');
  std::memcpy(digest.data(), words, sizeof words);
  return digest;
}

LayoutGroups GroupLayouts(const std::vector<std::string>& digests) {
  LayoutGroups g;
  g.layout_of_rank.reserve(digests.size());
  std::unordered_map<std::string, int> layout;
  for (size_t r = 0; r < digests.size(); ++r) {
    auto [it, inserted] = layout.try_emplace(digests[r], static_cast<int>(g.first_rank.size()));
    if (inserted) g.first_rank.push_back(static_cast<int>(r));
    g.layout_of_rank.push_back(it->second);
  }
  return g;
}

Result<io::Marker> PlanLayouts(const std::vector<std::string>& encoded, const LayoutGroups& groups,
                               uint64_t replica_parallel_min_bytes, uint64_t chunk_bytes) {
  std::vector<RankDescription> layouts;
  layouts.reserve(groups.first_rank.size());
  for (int r : groups.first_rank) {
    MHCKPT_ASSIGN_OR_RETURN(RankDescription d,
                            DecodeDescription(encoded.at(static_cast<size_t>(r))));
    layouts.push_back(std::move(d));
  }
  return BuildPlan(layouts, groups.layout_of_rank, replica_parallel_min_bytes, chunk_bytes);
}

}  // namespace mhckpt::internal
