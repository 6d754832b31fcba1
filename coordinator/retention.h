// Which committed steps a retention policy deletes.
#pragma once

#include <cstdint>
#include <vector>

namespace mhckpt::internal {

/// The steps of `committed` (ascending) to delete when keeping the newest
/// `max_to_keep` (0: keep all) plus every step that is a multiple of
/// `keep_period` (0: none). The newest step is never deleted.
std::vector<int64_t> StepsToDelete(const std::vector<int64_t>& committed, int max_to_keep,
                                   int64_t keep_period);

}  // namespace mhckpt::internal
