// What CheckpointManager::Open checks and agrees before a manager exists:
// the inputs, the same on every rank; rank 0's preparation of the root; and
// that every rank sees the root rank 0 prepared.
#pragma once

#include <memory>
#include <string>

#include "base/comm.h"
#include "base/status.h"
#include "coordinator/options.h"
#include "io/root_store.h"

namespace mhckpt::internal {

/// Collective, agreed: the options and the root path are valid on every
/// rank (CheckOptions, the save policy's numbers, CheckRootPath, a local dir
/// other than the root), and the options that decide which collective calls
/// a save makes (the replica check, the write rounds, the local tier's
/// protocol, the save policy), and the root itself, are the same on every
/// rank: ranks that differ would wait in different calls.
Status AgreeOpenInputs(const std::string& root, const Options& options, const Comm& comm);

/// Rank 0's part of Open: creates the root and checks that it is a
/// directory, takes ownership of it (the store's lock and lease, into
/// `*lock`), then removes steps without a marker and unfinished retirements,
/// only once the root is ours, so that a job still saving never loses its
/// step. The error names rank 0.
Status PrepareRoot(io::RootStore& store, const Options& options,
                   std::unique_ptr<io::RootOwnership>* lock);

/// Collective, agreed: every rank sees the root rank 0 opened. A root on
/// node-local storage (/tmp on every node) would have ranks write into
/// different directories, and collective file calls wait forever. With
/// ownership, rank 0's lease (just written: its host, pid and start time) is
/// the token every rank must find there. FailedPrecondition naming the rank
/// and its host.
Status AgreeRootIsShared(io::RootStore& store, bool own_root, const Comm& comm);

}  // namespace mhckpt::internal
