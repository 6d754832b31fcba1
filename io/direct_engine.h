// The direct engine behind the storage seam (io/storage.h): HDF5 lays a step
// out and keeps every byte of metadata, the ranks pwrite the array bytes at
// their datasets' file offsets. Two writers, chosen by
// StorageOptions::ranks_per_file:
//   io/direct_writer.h   one data file, ROOT/step_N/data.h5 (rank 0 lays it out)
//   io/subfile_writer.h  subfiles, data-<g>.h5 per group of ranks, and a
//                        data.h5 of virtual datasets over them
// Both lay their files out through io/dataset_layout.h, which also replays
// the last layout when a save has the same arrays (layout replay). The engine
// owns what outlives a step: the writer threads, the kept layouts, and the
// subfile groups (made at the first Create, again for another communicator).
// Its own reads go through HDF5 (independent hyperslabs); reads by offset
// are MakeEngine's (io/pread_reader.h, io/subfile_reader.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/dataset_layout.h"  // LayoutReplays, LayoutReplayEnabled
#include "io/storage.h"

namespace mhckpt::io {

/// `threads` writer threads (kept for the engine's lifetime); O_DIRECT with
/// `direct`; subfiles with `ranks_per_file` (StorageOptions).
std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct, int ranks_per_file = 0);

}  // namespace mhckpt::io
