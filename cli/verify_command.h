// mhckpt verify ROOT [--step N | --all]: re-reads committed steps through
// HDF5 and checks them against their commit markers. Collective: it may run
// under mpirun, each rank reading a share of the boxes.
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
  std::optional<int64_t> step;                ///< default: the newest committed step
  bool all = false;                           ///< every step that has a commit marker
  uint64_t chunk_bytes = uint64_t{64} << 20;  ///< largest single read
};

/// Collective over `comm`. For each selected step: the marker parses and is
/// valid, its boxes tile every array exactly once, the data file opens, every
/// dataset exists with the marker's type and shape, and every box reads back
/// with the XXH3 checksum the marker records for it. Without --step it also
/// reports any step whose marker exists but is invalid. Rank 0 prints a
/// report to `out` (each problem naming the step, the array and the box).
/// Returns DataLoss if anything is damaged, the same Status on every rank.
Status RunVerify(const VerifyArgs& args, MPI_Comm comm, std::FILE* out);

}  // namespace mhckpt::cli
