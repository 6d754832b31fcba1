// A committed step as every rank sees it: its commit marker, read once and
// shared, and what the marker says about the stored arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/comm.h"
#include "base/status.h"
#include "base/types.h"
#include "coordinator/checkpoint_manager.h"
#include "io/marker.h"
#include "io/root_store.h"
#include "io/storage.h"

namespace mhckpt::internal {

/// Collective: rank 0 reads the commit marker of `step` from `store` and
/// broadcasts its bytes; every rank parses the same bytes, so the outcome is
/// the same everywhere. NotFound if the step is not committed; IoError if
/// the marker cannot be read; DataLoss if it does not parse or names another
/// step.
Result<io::Marker> ReadMarkerEverywhere(const Comm& comm, io::RootStore& store, int64_t step);

/// DataLoss unless marker `m`, read as step `step`'s from `store`, names that
/// step (a marker copied from another step is not this step's).
Status CheckMarkerStep(const io::Marker& m, const io::RootStore& store, int64_t step);

/// How array `a` of a marker (or plan) is stored, with its recorded offset.
io::ArraySpec StoredSpec(const io::MarkerArray& a);

/// The marker says where `a`'s bytes lie in the data file (format version
/// 2), or it has none: it can be read by offset (io::ReadOptions::by_offset).
bool ReadableByOffset(const io::MarkerArray& a);

/// OK if `actual` is the checksum the marker records for box `b` of `a`;
/// otherwise DataLoss naming the array, the box and the rank that wrote it.
Status CheckChecksum(const io::MarkerArray& a, const io::MarkerBox& b, uint64_t actual);

/// OK if `actual` is the checksum the marker records for chunk `chunk` of
/// box `b` of `a` (a version-2 marker); otherwise DataLoss naming the array,
/// the box, the chunk and its rows, and the rank that wrote it.
Status CheckChunkChecksum(const io::MarkerArray& a, const io::MarkerBox& b, int64_t chunk,
                          uint64_t actual);

/// CheckChunkChecksum for each chunk of box `b` of `a` in `rows`, a run of
/// whole chunks of it (starting on a chunk; the box's last chunk may be
/// shorter) whose bytes, row-major, are at `data`. The first mismatch.
Status CheckChunks(const io::MarkerArray& a, const io::MarkerBox& b, const Box& rows,
                   const std::byte* data);

/// Checks one rank's restore requests against the step's marker: names
/// (known, not twice), dtypes, boxes inside shapes, buffers, memory kinds,
/// and with `options.strict` that every stored array is asked for. The
/// rank's error, naming the array, the rank and the box (restore.cc).
Status CheckRequests(const io::Marker& m, std::span<const ArrayToRestore> arrays,
                     const RestoreOptions& options, int rank);

}  // namespace mhckpt::internal
