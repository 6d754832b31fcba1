// The steps in a POSIX checkpoint root: which exist, which are committed, and
// how one is deleted. The POSIX root store's listing (io/posix_root_store.h);
// code above io/ reaches it through io/root_store.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "io/marker.h"
#include "io/root_store.h"

namespace mhckpt::io {

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

/// The first, quick half of deleting a step, so that no crash can leave it
/// half-deleted yet committed:
///   1. unlink the marker and fsync the step directory (the step is now
///      uncommitted, for every reader);
///   2. rename the step directory to a retired name in `root` (below), which
///      no listing takes for a step, and fsync the root.
/// Returns the retired directory's path. Nothing of the data is freed yet:
/// that is RemoveAll of the returned path, which can take long (an unlink of
/// a multi-GiB file on a file system mounted with `discard`, ~0.3 s per GiB
/// here) and can run in the background (the manager's deleter thread,
/// coordinator/manager_impl.h).
Result<std::string> RetireStep(const std::string& root, int64_t step);

/// A retired directory's name starts with this; the rest is the step
/// directory's name and a nonce, so that a step retired twice (saved again
/// after a retirement whose removal has not ended) gets two names.
inline constexpr std::string_view kRetiredPrefix = ".retired.";

/// The paths of the retired directories under `root`: left by a job that
/// ended (or crashed) before removing them.
Result<std::vector<std::string>> RetiredDirs(const std::string& root);

/// Deletes a step at once: RetireStep, then RemoveAll of the retired
/// directory and an fsync of the root.
Status DeleteStep(const std::string& root, int64_t step);

}  // namespace mhckpt::io
