#include "coordinator/retention.h"

#include <cstddef>

namespace mhckpt::internal {

std::vector<int64_t> StepsToDelete(const std::vector<int64_t>& committed, int max_to_keep,
                                   int64_t keep_period) {
  std::vector<int64_t> out;
  if (max_to_keep <= 0) return out;
  const size_t keep_from = committed.size() > static_cast<size_t>(max_to_keep)
                               ? committed.size() - static_cast<size_t>(max_to_keep)
                               : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    int64_t step = committed[i];
    if (keep_period > 0 && step % keep_period == 0) continue;
    out.push_back(step);
  }
  return out;
}

}  // namespace mhckpt::internal
