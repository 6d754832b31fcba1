// What the CLI knows about the steps of a checkpoint root: the listing of its
// root store (io/root_store.h), each committed step's marker, and the bytes
// on disk.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::cli {

struct StepInfo {
  io::StepEntry entry;
  std::optional<io::Marker> marker;  ///< set for committed steps
  uint64_t bytes_on_disk = 0;        ///< apparent size of the step directory
};

/// The store of an existing root; NotFound if `root` does not exist.
Result<std::unique_ptr<io::RootStore>> OpenRoot(const std::string& root);

/// Every step of the root (retired ones aside), ascending, with markers read.
Result<std::vector<StepInfo>> ReadSteps(io::RootStore& store);

/// The step to work on: `step` if given, else the newest committed one.
/// NotFound when there is none, or when `step` has no marker; DataLoss (from
/// the marker parser) when its marker exists but is invalid.
Result<io::Marker> ReadCommittedStep(io::RootStore& store, std::optional<int64_t> step);

/// "committed", "uncommitted" or "invalid_marker".
std::string StepState(const io::StepEntry& entry);

}  // namespace mhckpt::cli
