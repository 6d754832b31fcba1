// What the CLI knows about the steps of a checkpoint root: the listing from
// io/catalog.h, each committed step's marker, and the bytes on disk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/catalog.h"
#include "io/marker.h"

namespace mhckpt::cli {

struct StepInfo {
  io::StepEntry entry;
  std::optional<io::Marker> marker;  ///< set for committed steps
  uint64_t bytes_on_disk = 0;        ///< apparent size of the step directory
};

/// Every step directory under `root`, ascending, with markers read.
/// NotFound if `root` does not exist.
Result<std::vector<StepInfo>> ReadSteps(const std::string& root);

/// The step to work on: `step` if given, else the newest committed one.
/// NotFound when there is none, or when `step` has no marker; DataLoss (from
/// the marker parser) when its marker exists but is invalid.
Result<io::Marker> ReadCommittedStep(const std::string& root, std::optional<int64_t> step);

/// "committed", "uncommitted" or "invalid_marker".
std::string StepState(const io::StepEntry& entry);

}  // namespace mhckpt::cli
