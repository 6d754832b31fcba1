// Where a checkpoint lives on disk (docs/FORMAT.md):
//   ROOT/step_0000000042/data.h5      the arrays, as global HDF5 datasets
//   ROOT/step_0000000042/index.bin    every box's checksums (format 3)
//   ROOT/step_0000000042/data-00000.h5 with subfiles (Options::files): one
//                                      data file per group of ranks, and
//                                      data.h5 maps the arrays onto them
//   ROOT/step_0000000042/commit.json  the commit marker; present = committed
//   ROOT/mhckpt.lock                   locked (flock) by the job that owns ROOT
//   ROOT/mhckpt.lease                  who owns ROOT, with a heartbeat
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mhckpt::io {

inline constexpr std::string_view kDataFileName = "data.h5";
inline constexpr std::string_view kMarkerFileName = "commit.json";
/// Format version 3: every box's checksums (io/step_index.h).
inline constexpr std::string_view kIndexFileName = "index.bin";
inline constexpr std::string_view kLockFileName = "mhckpt.lock";
inline constexpr std::string_view kLeaseFileName = "mhckpt.lease";
/// The largest lease file a reader accepts.
inline constexpr size_t kMaxLeaseBytes = 64 * 1024;
/// The local saves deleted by CheckpointManager::Delete (a JSON object):
/// a node outside the job that deleted them must not bring them back.
inline constexpr std::string_view kLocalDeletionsFileName = "mhckpt.local-deletions";

/// "step_0000000042".
std::string StepDirName(int64_t step);
/// The step of a directory named by StepDirName, or nullopt for any other name.
std::optional<int64_t> ParseStepDirName(std::string_view name);

std::string StepDir(const std::string& root, int64_t step);
std::string DataPath(const std::string& root, int64_t step);
std::string MarkerPath(const std::string& root, int64_t step);
std::string IndexPath(const std::string& root, int64_t step);
/// Subfile `file` of a step with subfiles (Marker::files): "data-00003.h5".
std::string SubfileName(int64_t file);
std::string SubfilePath(const std::string& root, int64_t step, int64_t file);

}  // namespace mhckpt::io
