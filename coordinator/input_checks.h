// What Open and Save check of their inputs before anything collective or
// anything that could throw (nlohmann::json, a thread, a path) sees them.
// Each check is local and returns InvalidArgument naming the rank; the
// callers make every rank agree on the outcome (Open: AgreeAll; Save: the
// error travels with the rank's description into the plan round).
#pragma once

#include <string>

#include "base/status.h"
#include "coordinator/checkpoint_manager.h"

namespace mhckpt::internal {

/// Options values outside their ranges (docs/RELIABILITY.md lists them).
Status CheckOptions(const Options& options, int rank);

/// The root as a string: not empty, no NUL byte, short enough that every
/// path under it fits PATH_MAX.
Status CheckRootPath(const std::string& root, int rank);

/// Step numbers 0..kMaxStep.
Status CheckStep(int64_t step, int rank);

/// User metadata (taken from rank 0, which checks it): every key and value
/// valid UTF-8, keys of 1..kMaxMetadataKeyBytes bytes, at most
/// kMaxMetadataEntries entries and kMaxMetadataBytes of keys and values.
Status CheckUserMetadata(const UserMetadata& metadata, int rank);

}  // namespace mhckpt::internal
