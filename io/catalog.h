// The steps in a checkpoint root: which exist, which are committed, and how
// one is deleted. Shared by CheckpointManager and the mhckpt CLI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/marker.h"

namespace mhckpt::io {

struct StepEntry {
  int64_t step = 0;
  bool committed = false;  ///< the marker exists and is valid
  Status marker;           ///< why not, when a marker exists but is invalid
};

/// Every step directory under `root`, ascending by step.
Result<std::vector<StepEntry>> ListSteps(const std::string& root);

/// Listing reads every marker, but parses a marker's text only once per
/// process: bytes equal (XXH3-128, length) to a text already found valid are
/// valid.
///
/// Records that `text` (MarkerToJson(marker)), the marker of `marker.step`
/// under `root`, is valid if `marker` passes the checks a parse makes
/// (CheckMarker): for the rank that has just written it atomically, so that
/// the listing right after (retention) need not parse it again.
void RememberValidMarker(const std::string& root, const Marker& marker, const std::string& text);

/// The committed steps under `root`, ascending.
Result<std::vector<int64_t>> CommittedSteps(const std::string& root);

/// Deletes a step so that no crash can leave it half-deleted yet committed:
///   1. unlink the marker and fsync the step directory (the step is now
///      uncommitted, for every reader);
///   2. remove the directory tree and fsync the root.
Status DeleteStep(const std::string& root, int64_t step);

}  // namespace mhckpt::io
