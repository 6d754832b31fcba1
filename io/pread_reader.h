// Reads of a step's array bytes at the file offsets the commit marker
// records (ArraySpec::offset), with pread from the data file opened once,
// read-only — no HDF5 dataset is opened for them (ReadOptions::by_offset).
// Both engines store a step as one plain HDF5 file whose datasets are
// contiguous, row-major and never moved, so an array's recorded offset is
// where its bytes lie however they were written.
//
// A batch of reads (StepReader::ReadMany) is cut into the contiguous runs of
// its boxes, sorted by file offset, and neighbours are joined into one
// preadv: runs no more than kJoinGapBytes apart (the gap is read into a
// scratch buffer and dropped), up to kMaxJoinedBytes and IOV_MAX pieces per
// request. So many small arrays lying together in the file are read in a
// few large requests. The kernel is told the whole file is read
// sequentially, and the requests' ranges are announced (WILLNEED) up to
// 64 MiB ahead of the one being made. Every read goes through the fault seam (base/fault.h, point
// `pread`: eio, eintr, short); EINTR and short reads are retried, an early
// end of file is DataLoss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/storage.h"

namespace mhckpt::io {

/// Runs at most this far apart are read in one request.
inline constexpr uint64_t kJoinGapBytes = uint64_t{64} << 10;
/// A joined request reads at most this many bytes (a single run may be longer).
inline constexpr uint64_t kMaxJoinedBytes = uint64_t{16} << 20;

/// Opens step `step`'s data file `path` for reads by offset. `metadata`, if
/// not null, is an engine's reader of the same step: OpenArray checks each
/// array through it first (it is closed by Close). IoError if the file
/// cannot be opened.
Result<std::unique_ptr<StepReader>> OpenPreadReader(const std::string& path, int64_t step,
                                                    std::unique_ptr<StepReader> metadata);

}  // namespace mhckpt::io
