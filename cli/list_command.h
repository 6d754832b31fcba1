// mhckpt list ROOT [--local-dir DIR] [--json]: every step directory,
// committed or not; with --local-dir, also the steps of this node's local
// tier and the files of which ranks the node holds.
#pragma once

#include <cstdio>
#include <string>

#include "base/status.h"

namespace mhckpt::cli {

struct ListArgs {
  std::string root;
  std::string local_dir;  ///< this node's local tier (Options::local_dir), or ""
  bool json = false;
};

/// Prints a table (or a JSON document) of the steps under `root` to `out`:
/// step, state, bytes on disk, world size at save and creation time.
Status RunList(const ListArgs& args, std::FILE* out);

}  // namespace mhckpt::cli
