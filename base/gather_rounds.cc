#include "base/gather_rounds.h"

#include <algorithm>
#include <climits>

namespace mhckpt::internal {

GatherRounds PlanGatherRounds(const std::vector<int64_t>& sizes, int64_t limit) {
  limit = std::clamp<int64_t>(limit, 1, INT_MAX);
  int64_t total = 0, largest = 0;
  for (int64_t s : sizes) {
    total += s;
    largest = std::max(largest, s);
  }
  if (largest == 0) return {};
  if (total <= limit) return {largest, 1};
  const int64_t ranks = std::max<int64_t>(1, static_cast<int64_t>(sizes.size()));
  const int64_t piece = std::max<int64_t>(1, limit / ranks);
  return {piece, (largest + piece - 1) / piece};
}

std::pair<int64_t, int64_t> GatherPiece(int64_t size, const GatherRounds& r, int64_t round) {
  const int64_t begin = std::min(size, round * r.piece);
  const int64_t end = std::min(size, begin + r.piece);
  return {begin, end - begin};
}

std::optional<GatherLayout> GatherRoundLayout(const std::vector<int64_t>& sizes,
                                              const GatherRounds& r, int64_t round) {
  GatherLayout l;
  l.counts.reserve(sizes.size());
  l.displs.reserve(sizes.size());
  for (int64_t s : sizes) {
    const int64_t n = GatherPiece(s, r, round).second;
    if (n > INT_MAX || l.total > INT_MAX) return std::nullopt;
    l.displs.push_back(static_cast<int>(l.total));
    l.counts.push_back(static_cast<int>(n));
    l.total += n;
  }
  return l;
}

}  // namespace mhckpt::internal
