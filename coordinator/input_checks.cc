#include "coordinator/input_checks.h"

#include <climits>
#include <cmath>

#include <fmt/format.h>

namespace mhckpt::internal {
namespace {

// The longest path below the root: "/step_<18 digits>/commit.json.tmp" and
// some spare, so that no path mhckpt makes under the root passes PATH_MAX.
constexpr size_t kLongestPathBelowRoot = 64;

// A collective phase may last at most this long (about 31 years): beyond it
// the watchdog's deadline would overflow its clock.
constexpr double kMaxTimeoutSeconds = 1e9;
constexpr int kMaxSnapshotThreads = 256;

// Why `path` cannot be a root (or local dir), or "".
std::string CheckRootPathText(const std::string& path) {
  if (path.empty()) return "is empty";
  if (path.find('\0') != std::string::npos) {
    return fmt::format("'{}' holds a NUL byte", QuoteForMessage(path));
  }
  if (path.size() + kLongestPathBelowRoot > PATH_MAX) {
    return fmt::format("is {} bytes long, more than {}", path.size(),
                       PATH_MAX - kLongestPathBelowRoot);
  }
  return "";
}

}  // namespace

Status CheckOptions(const Options& o, int rank) {
  auto bad = [rank](const std::string& what) {
    return InvalidArgument(fmt::format("rank {}: Options::{}", rank, what));
  };
  if (o.transfer != Transfer::kIndependent && o.transfer != Transfer::kCollective) {
    return bad(fmt::format("transfer {} is not a Transfer", static_cast<int>(o.transfer)));
  }
  if (o.format_version != 2 && o.format_version != 3) {
    return bad(fmt::format("format_version {} is neither 2 nor 3", o.format_version));
  }
  if (o.files.ranks_per_file < DataFiles::kPerNode) {
    return bad(fmt::format("files.ranks_per_file {} is neither 0 (one file), kPerNode nor positive",
                           o.files.ranks_per_file));
  }
  if (o.files.ranks_per_file != 0 && o.format_version < 3) {
    return bad("files: subfiles need format_version 3 (the index holds where each box lies)");
  }
  if (o.files.ranks_per_file != 0 &&
      (o.transfer != Transfer::kIndependent || o.data_path == DataPath::kHdf5)) {
    return bad(
        "files: subfiles are written by the direct engine: Transfer::kIndependent with "
        "DataPath::kDirect or kBuffered");
  }
  if (o.max_to_keep < 0) return bad(fmt::format("max_to_keep {} is negative", o.max_to_keep));
  if (o.keep_period < 0) return bad(fmt::format("keep_period {} is negative", o.keep_period));
  if (!std::isfinite(o.keep_time_interval_seconds) || o.keep_time_interval_seconds < 0) {
    return bad(fmt::format("keep_time_interval_seconds {} is not a finite number >= 0",
                           o.keep_time_interval_seconds));
  }
  if (o.keep_best.metric.size() > kMaxMetadataKeyBytes) {
    return bad(fmt::format("keep_best.metric has {} bytes, more than a metadata key may ({})",
                           o.keep_best.metric.size(), kMaxMetadataKeyBytes));
  }
  if (!std::isfinite(o.collective_timeout_seconds) || o.collective_timeout_seconds < 0 ||
      o.collective_timeout_seconds > kMaxTimeoutSeconds) {
    return bad(fmt::format("collective_timeout_seconds {} is outside 0 (off) to {:.0f}",
                           o.collective_timeout_seconds, kMaxTimeoutSeconds));
  }
  if (o.snapshot_threads < 0 || o.snapshot_threads > kMaxSnapshotThreads) {
    return bad(fmt::format("snapshot_threads {} is outside 0 (automatic) to {}", o.snapshot_threads,
                           kMaxSnapshotThreads));
  }
  if (!o.local_dir.empty()) {
    if (!o.own_root) return bad("local_dir needs own_root: a reader keeps no local tier");
    if (std::string why = CheckRootPathText(o.local_dir); !why.empty()) {
      return bad(fmt::format("local_dir {}", why));
    }
  }
  if (o.persistent_every < 1) {
    return bad(fmt::format("persistent_every {} is less than 1", o.persistent_every));
  }
  if (o.local_max_to_keep < 1) {
    return bad(fmt::format("local_max_to_keep {} is less than 1", o.local_max_to_keep));
  }
  if (o.local_copies < 0) return bad(fmt::format("local_copies {} is negative", o.local_copies));
  if (o.local_parity_group < 0 || o.local_parity_group == 1) {
    return bad(fmt::format("local_parity_group {} is neither 0 (off) nor at least 2",
                           o.local_parity_group));
  }
  if (!std::isfinite(o.persistent_deadline_seconds) || o.persistent_deadline_seconds < 0 ||
      o.persistent_deadline_seconds > kMaxTimeoutSeconds) {
    return bad(fmt::format("persistent_deadline_seconds {} is outside 0 (off) to {:.0f}",
                           o.persistent_deadline_seconds, kMaxTimeoutSeconds));
  }
  if (o.node_id < -1) return bad(fmt::format("node_id {} is less than -1", o.node_id));
  return OkStatus();
}

Status CheckRootPath(const std::string& root, int rank) {
  if (std::string why = CheckRootPathText(root); !why.empty()) {
    return InvalidArgument(fmt::format("rank {}: the root path {}", rank, why));
  }
  return OkStatus();
}

Status CheckStep(int64_t step, int rank) {
  if (step < 0) return InvalidArgument(fmt::format("rank {}: step {} is negative", rank, step));
  if (step > kMaxStep) {
    return InvalidArgument(
        fmt::format("rank {}: step {} is larger than the largest step, {}", rank, step, kMaxStep));
  }
  return OkStatus();
}

Status CheckUserMetadata(const UserMetadata& metadata, int rank) {
  auto bad = [rank](const std::string& what) {
    return InvalidArgument(fmt::format("rank {}: user metadata: {}", rank, what));
  };
  if (metadata.size() > kMaxMetadataEntries) {
    return bad(fmt::format("{} entries, more than {}", metadata.size(), kMaxMetadataEntries));
  }
  size_t total = 0;
  for (const auto& [key, value] : metadata) {
    if (key.empty()) return bad("an empty key");
    if (key.size() > kMaxMetadataKeyBytes) {
      return bad(fmt::format("key '{}' is {} bytes long, more than {}", QuoteForMessage(key),
                             key.size(), kMaxMetadataKeyBytes));
    }
    if (std::string why = CheckUtf8(key); !why.empty()) {
      return bad(fmt::format("key '{}' is {}", QuoteForMessage(key), why));
    }
    if (std::string why = CheckUtf8(value); !why.empty()) {
      return bad(fmt::format("the value of key '{}' is {}", QuoteForMessage(key), why));
    }
    total += key.size() + value.size();
    if (total > kMaxMetadataBytes) {
      return bad(fmt::format("keys and values add up to more than {} bytes (at key '{}')",
                             kMaxMetadataBytes, QuoteForMessage(key)));
    }
  }
  return OkStatus();
}

}  // namespace mhckpt::internal
