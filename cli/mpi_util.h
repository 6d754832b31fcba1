// The few MPI patterns the CLI needs (verify is its only collective command).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::cli {

/// Collective: `root`'s string on every rank.
void BroadcastString(std::string* s, int root, MPI_Comm comm);

/// Collective: every rank's strings, concatenated in rank order, at `root`
/// (an empty vector elsewhere).
std::vector<std::string> GatherStrings(const std::vector<std::string>& mine, int root,
                                       MPI_Comm comm);

/// Collective: `root`'s Status on every rank.
Status BroadcastStatus(const Status& s, int root, MPI_Comm comm);

}  // namespace mhckpt::cli
