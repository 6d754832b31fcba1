// The demo's job from start to end: open the checkpoint directory, start
// fresh or restore the latest committed step (on any world size), train, and
// save asynchronously every few steps.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

#include "base/status.h"

namespace mhckpt::demo {

struct TrainFlags {
  std::string dir;
  int64_t steps = 200;      ///< train until this global step
  int64_t save_every = 50;  ///< 0: save only at the end
  double model_mib = 64;    ///< sharded state size (weights, Adam m and v)
  bool model_mib_given = false;
  bool resume = false;
  int max_to_keep = 3;
  std::string local_dir;     ///< Options::local_dir ("": one tier)
  int persistent_every = 1;  ///< Options::persistent_every
  int ranks_per_file = 0;    ///< Options::files.ranks_per_file (0: one data file; -1: per node)
  /// Save with CopyMode::kLazy: Save returns before copying; the next step
  /// waits for the copy (the fence) before it overwrites the arrays.
  bool lazy = false;
  /// Options::save_continuously: also save whenever the previous save has
  /// finished on every rank (CheckpointManager::ShouldSave).
  bool continuous = false;
  /// Options::preemption.enabled: SIGTERM and SIGUSR1 are preemption notices;
  /// at the step every rank agrees on (ReachedPreemption) the demo saves,
  /// waits for the commit and exits 0.
  bool preemption = false;
  double grace_seconds = 0;  ///< Options::preemption.grace_seconds (0: unknown)
  int64_t log_every = 10;
  uint64_t seed = 1;
  int64_t global_batch = 64;
  float learning_rate = 3e-4f;
};

/// Collective over `comm`. Runs the job; the Status is the same on every rank.
Status RunTraining(const TrainFlags& flags, MPI_Comm comm);

}  // namespace mhckpt::demo
