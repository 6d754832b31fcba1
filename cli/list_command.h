// mhckpt list ROOT [--json]: every step directory, committed or not.
#pragma once

#include <cstdio>
#include <string>

#include "base/status.h"

namespace mhckpt::cli {

struct ListArgs {
  std::string root;
  bool json = false;
};

/// Prints a table (or a JSON document) of the steps under `root` to `out`:
/// step, state, bytes on disk, world size at save and creation time.
Status RunList(const ListArgs& args, std::FILE* out);

}  // namespace mhckpt::cli
