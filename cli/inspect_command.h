// mhckpt inspect ROOT [--step N] [--json]: what one committed step holds.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "base/status.h"

namespace mhckpt::cli {

struct InspectArgs {
  std::string root;
  std::optional<int64_t> step;  ///< default: the newest committed step
  bool json = false;
};

/// Prints the step's marker to `out`: every array (name, dtype, shape, boxes
/// and the rank that wrote each; in JSON also each box's checksum) and the
/// user metadata. NotFound if the step
/// is not committed, DataLoss if its marker is damaged.
Status RunInspect(const InspectArgs& args, std::FILE* out);

}  // namespace mhckpt::cli
