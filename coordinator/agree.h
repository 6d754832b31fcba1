// Error agreement: every collective phase of mhckpt ends here, so that all
// ranks leave it with the same Status and none returns early.
#pragma once

#include "base/comm.h"
#include "base/status.h"

namespace mhckpt::internal {

/// Collective. OK on every rank if `local` is OK on every rank; otherwise the
/// error of the lowest failing rank, on every rank, noting how many ranks
/// failed. One allreduce when all is well.
Status AgreeAll(const Status& local, const Comm& comm);

/// `first` (the lowest failing rank's error) noting that `failed` ranks failed
/// in all: "... (and 2 more ranks failed)". Local.
Status WithFailedCount(const Status& first, int failed);

/// Collective. `root`'s status on every rank.
Status BroadcastStatus(const Status& status, int root, const Comm& comm);

}  // namespace mhckpt::internal
