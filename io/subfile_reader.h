// Reads of a step whose array bytes are in subfiles (Marker::files;
// io/subfile_writer.h): each stored box is read by offset from
// its subfile (OpenBox), through one pread reader per subfile
// (io/pread_reader.h), opened when a box of it is first opened. A batch
// (ReadMany) is split by subfile, and each subfile's reader sorts and joins
// its part as it does for a step's one data file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/storage.h"

namespace mhckpt::io {

/// The reader of step `step` under `root`, with `options.files` subfiles.
/// `metadata`, if not null, is an engine's reader of the step's data.h5:
/// OpenArray checks each array's virtual dataset through it (verify), and
/// Close closes it. Without one, OpenArray is local and touches nothing.
std::unique_ptr<StepReader> OpenSubfileReader(const std::string& root, int64_t step,
                                              std::unique_ptr<StepReader> metadata,
                                              const ReadOptions& options);

}  // namespace mhckpt::io
