// mhckpt verify ROOT [--step N | --all]: checks committed steps against their
// commit markers with the library's CheckpointManager::Verify. Collective: it
// may run under mpirun, each rank reading a share of the boxes.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "base/status.h"

namespace mhckpt::cli {

struct VerifyArgs {
  std::string root;
  std::optional<int64_t> step;  ///< default: the newest committed step
  bool all = false;             ///< every step that has a commit marker
};

/// Collective over `comm`. Verifies each selected step (CheckpointManager::
/// Verify: the marker, the tiling of its boxes, every array's dtype and
/// shape, every box's checksum). Without --step it also reports any step
/// whose marker exists but is invalid. Rank 0 prints a report to `out`
/// (each problem naming the step, the array and the box) and a progress
/// line on a terminal. Returns the same Status on every rank: NotFound (no
/// root, no committed step), DataLoss if anything is damaged (the first
/// problem and their count), IoError.
Status RunVerify(const VerifyArgs& args, MPI_Comm comm, std::FILE* out);

}  // namespace mhckpt::cli
