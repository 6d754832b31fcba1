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
// 64 MiB ahead of the one being made. Runs longer than kPieceBytes are cut
// into pieces first, so no request is larger than kMaxJoinedBytes.
//
// With `prefault`, a second thread faults in the destination pages of the
// requests after the one being read (MADV_POPULATE_WRITE, on each piece's
// whole pages) while it is read. A read into new memory otherwise takes a
// page fault for every 4 KiB page inside the kernel's copy out of the page
// cache, one after the other: on the VM of docs/PERFORMANCE.md a third of
// a cold restore's time. The thread only runs ahead of the reads, never
// over the request being read; where the kernel refuses (no
// MADV_POPULATE_WRITE before Linux 5.14, a mapping it cannot populate) it
// stops, and the reads fault the pages themselves. Batches below
// kPrefaultMinBytes are read without it.
//
// With `direct`, the long runs are read with O_DIRECT straight into their
// destinations, by up to kDirectReadThreads threads at once: the device
// puts the bytes where they go, and the kernel neither fills the page cache
// nor copies out of it (on the VM of docs/PERFORMANCE.md that copy and the
// first touch of new pages were most of a cold restore). A
// piece of a batch is read directly when it is at least
// kDirectReadMinBytes long after its unaligned head, its destination and
// its file offset line up (equal modulo the file system's direct-I/O
// alignment: statx STATX_DIOALIGN, 512 B on ext4 here, else a page), and the
// page cache does not already hold most of it (cachestat, Linux 6.5; a
// warm file is read from the cache). Its head and tail, short runs and
// unaligned destinations are read as above, through the page cache; where
// the file system refuses O_DIRECT, everything is. Except two kinds that
// the same threads read directly into a bounce buffer of their own, in
// aligned spans of at most kBounceReadBytes, and copy out: pieces at least
// kDirectReadMinBytes long whose destination does not line up (a rank's
// share of an array whose rows are not a multiple of the alignment, an array
// packed at any offset: page-aligned memory never lines up with them; read
// through the page cache, such a share was the one rank of a restore not
// read directly, and the slowest), and runs of short pieces lying close
// together (gaps of at most kJoinGapBytes, each shorter than
// kDirectReadMinBytes: many small arrays, a rank's side by side) that span
// at least kDirectReadMinBytes. New memory from the library (numpy arrays
// it makes, pinned buffers) is page-aligned, so its reads line up whenever
// the array's rows do.
//
// A request's ReadRequest::on_read runs as soon as its last byte is in, on
// the thread that read it (the batch's own, or a direct read's): the
// restore's checksums and copies out of its bounce memory overlap the reads
// that follow instead of waiting for the whole batch.
//
// Every read goes through the fault seam (base/fault.h, point `pread`: eio,
// eintr, short); EINTR and short reads are retried, an early end of file is
// DataLoss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/storage.h"

namespace mhckpt::io {

/// Runs at most this far apart are read in one request.
inline constexpr uint64_t kJoinGapBytes = uint64_t{64} << 10;
/// A joined request reads at most this many bytes.
inline constexpr uint64_t kMaxJoinedBytes = uint64_t{16} << 20;
/// Longer runs are read in pieces of this size (two to a request).
inline constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
/// A batch with fewer destination bytes is read without prefaulting.
inline constexpr uint64_t kPrefaultMinBytes = uint64_t{4} << 20;
/// Shorter pieces are read through the page cache (with `direct`).
inline constexpr uint64_t kDirectReadMinBytes = uint64_t{256} << 10;
/// Runs of short pieces read directly through a bounce buffer span at most
/// this many bytes.
inline constexpr uint64_t kBounceReadBytes = uint64_t{4} << 20;
/// Direct reads in flight at once, per reader.
inline constexpr size_t kDirectReadThreads = 4;

/// Opens step `step`'s data file `path` for reads by offset. `metadata`, if
/// not null, is an engine's reader of the same step: OpenArray checks each
/// array through it first (it is closed by Close). `options.prefault` and
/// `options.direct`: see above. IoError if the file cannot be opened.
Result<std::unique_ptr<StepReader>> OpenPreadReader(const std::string& path, int64_t step,
                                                    std::unique_ptr<StepReader> metadata,
                                                    const ReadOptions& options = {});

}  // namespace mhckpt::io
