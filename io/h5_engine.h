// The parallel-HDF5 engine behind the storage seam (io/storage.h): a step is
// one HDF5 file, ROOT/step_N/data.h5 (io/layout.h), holding each array as a
// global dataset at a path named after it, written and read as hyperslabs
// (io/h5_file.h). The format is in docs/FORMAT.md.
#pragma once

#include <memory>

#include "io/storage.h"

namespace mhckpt::io {

/// Writes move bytes with `transfer` (independent or collective MPI-IO);
/// reads are independent.
std::unique_ptr<Engine> MakeH5Engine(Transfer transfer);

}  // namespace mhckpt::io
