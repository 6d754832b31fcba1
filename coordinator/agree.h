// Error agreement: every collective phase of mhckpt ends here, so that all
// ranks leave it with the same Status and none returns early.
#pragma once

#include "base/status.h"
#include "coordinator/comm.h"

namespace mhckpt::internal {

/// Collective. OK on every rank if `local` is OK on every rank; otherwise the
/// error of the lowest failing rank, on every rank, noting how many ranks
/// failed. One allreduce when all is well.
Status AgreeAll(const Status& local, const Comm& comm);

/// Collective. `root`'s status on every rank.
Status BroadcastStatus(const Status& status, int root, const Comm& comm);

}  // namespace mhckpt::internal
