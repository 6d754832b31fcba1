// The direct engine's writer of subfiles (StorageOptions::ranks_per_file,
// Options::files; io/direct_engine.h): the ranks are split into groups (k
// consecutive ranks, or the ranks of a node), numbered by their lowest rank,
// and group g writes ROOT/step_N/data-<g>.h5 alone. There the group's first
// rank lays out one dataset per box its group writes (io/dataset_layout.h:
// SubfileBoxes and LayOutSubfile, replayed when the boxes are the last
// save's) and closes the file; the group learns the offsets; each writer
// pwrites every box whole at its dataset's offset, as the direct writer
// does (io/direct_writer.h). Rank 0 meanwhile writes data.h5 with one HDF5
// virtual dataset per array mapping its boxes onto the subfiles
// (LayOutVirtualFile), so tools reading data.h5 see the global arrays.
// Place() tells each writer where its boxes lie, which it records in the
// step's index (io/step_index.h): readers read boxes by offset from the
// subfiles (io/subfile_reader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "io/dataset_layout.h"
#include "io/raw_writer.h"
#include "io/storage.h"

namespace mhckpt::io {

/// Which group, and so which subfile, each rank writes.
struct SubfileGroups {
  uint64_t comm_id = 0;      ///< Comm::id() of the communicator they were made for
  std::vector<int> of_rank;  ///< the group of each rank
  int count = 0;
  int mine = 0;
  Comm comm;  ///< this rank's group; its rank 0 (the group's lowest) lays the subfile out
};

/// Collective over `comm`: groups of `ranks_per_file` consecutive ranks, or
/// (kFilePerNode) of the ranks sharing memory, numbered in the order of
/// their lowest ranks.
SubfileGroups MakeSubfileGroups(const Comm& comm, int ranks_per_file);

/// What the subfile writer is made with: the engine's parts, which outlive it.
struct SubfileWriterOptions {
  RawWriterPool* pool = nullptr;               ///< the engine's writer threads
  bool direct = false;                         ///< O_DIRECT where the file system accepts it
  const SubfileGroups* groups = nullptr;       ///< made for the Create's communicator
  LayoutSkeleton* subfile_skeleton = nullptr;  ///< the group's first rank's last subfile
  LayoutSkeleton* data_skeleton = nullptr;     ///< rank 0's last data.h5
};

/// Collective over `comm`: each group's first rank creates its subfile, and
/// rank 0 data.h5. IoError if a group's first rank could not create its
/// subfile (on that group's ranks) or rank 0 data.h5 (on rank 0).
Result<std::unique_ptr<StepWriter>> CreateSubfileStepWriter(const std::string& root, int64_t step,
                                                            const Comm& comm,
                                                            const SubfileWriterOptions& options);

}  // namespace mhckpt::io
