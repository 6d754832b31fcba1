// The direct engine behind the storage seam (io/storage.h): HDF5 lays out a
// step exactly as the HDF5 engine does (io/h5_engine.h: ROOT/step_N/data.h5,
// one global dataset per array, contiguous, allocated at creation, never
// filled, large ones aligned) and keeps every byte of metadata; the array
// bytes are pwritten by each rank at its datasets' file offsets
// (io/raw_writer.h), with O_DIRECT where the file system accepts it. The file
// is plain HDF5: h5py, h5dump and the HDF5 engine's reader read it.
//
// Rank 0 alone lays the file out, through HDF5's POSIX driver: it creates
// every dataset, closes the file (HDF5 writes its metadata), and broadcasts
// the datasets' offsets; the other ranks never call HDF5 while saving.
//
// Rank 0 creates the datasets grouped by writer (ArraySpec::writer): HDF5
// packs small datasets created one after another, so each rank's small
// arrays lie side by side and its writes join into long runs.
//
// Layout replay: rank 0 keeps the bytes HDF5 wrote for the last layout — the
// file outside the arrays' extents (superblock, groups, object headers; the
// holes of alignment gaps are skipped with SEEK_DATA), a few MiB for 10,000
// arrays, at most 64 MiB — with the layout itself. A save of the same
// arrays (names, dtypes, shapes, writers, in the same order: every step of a
// training run) writes those bytes into the new file instead of creating every
// dataset again, since HDF5 would write the same metadata at the same
// addresses: nothing in it depends on the step. (The one difference: HDF5's
// object timestamps are those of the first layout.) For 10,000 arrays this
// takes the 0.4-0.6 s of dataset creation off every save after the first
// (docs/PERFORMANCE.md, "Measurements behind the defaults"). Any array that differs lays out
// through HDF5 again; so does a new manager.
//
// The kept bytes are HDF5's private on-disk encoding (object headers, global
// heap, superblock checksum), and "HDF5 would write the same bytes" has been
// checked with one release only, 1.10.8 (Debian's). So replay runs only where
// the HDF5 that mhckpt was compiled against (CMake reads its version into
// MHCKPT_HDF5_BUILD_*) and the one loaded at run time (H5get_libversion) are
// both that release; otherwise every save lays out through HDF5, and rank 0
// says so once in the log.
//
// Why HDF5 never writes stale bytes over the pwritten ones: a dataset
// created with H5D_FILL_TIME_NEVER is never written by HDF5 unless through
// H5Dwrite, which this engine never calls; its metadata lives at other
// addresses; and HDF5 keeps no raw-data cache for datasets it neither read
// nor wrote. Closing the file writes metadata only and may lengthen the file
// to HDF5's end of allocation, which lies past every dataset; a page shared
// by metadata and array bytes is written through the page cache by both
// (io/raw_writer.h writes only whole pages of array bytes directly). So the
// order is: rank 0 creates the datasets and closes the file (metadata, no
// sync), everyone pwrites, then one fsync per rank of the file, which makes
// both durable (fsync covers every descriptor of a file).
// tests/direct_engine_test.cc checks it byte for byte through HDF5, h5py and
// h5dump.
//
// Subfiles (StorageOptions::ranks_per_file, Options::files): the ranks are
// split into groups (k consecutive ranks, or the ranks of a node), numbered
// by their lowest rank, and group g writes ROOT/step_N/data-<g>.h5 alone.
// There the group's first rank lays out one dataset per box its group
// writes (box_<array>_<box>, the box's shape, by writer so that a rank's
// boxes lie side by side) and closes the file; the group learns the
// offsets; each writer pwrites every box whole at its dataset's offset, as
// above. Rank 0 meanwhile writes data.h5 with one HDF5 virtual dataset per
// array mapping its boxes onto the subfiles (HDF5 1.10's file format), so
// tools reading data.h5 see the global arrays. Place() tells each writer
// where its boxes lie, which it records in the step's index
// (io/step_index.h): readers read boxes by offset from the subfiles
// (io/subfile_reader.h). Layout replay works as above: each group's first
// rank replays its subfile's layout, and rank 0 data.h5 (nothing but
// metadata, a few MiB for 10,000 arrays), when the arrays, their boxes and
// their writers are those of the engine's last save.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/storage.h"

namespace mhckpt::io {

/// `threads` writer threads (kept for the engine's lifetime); O_DIRECT with
/// `direct`; subfiles with `ranks_per_file` (StorageOptions). Its own reads
/// go through HDF5 (independent hyperslabs); reads by offset are
/// MakeEngine's (io/pread_reader.h, io/subfile_reader.h).
std::unique_ptr<Engine> MakeDirectEngine(int threads, bool direct, int ranks_per_file = 0);

/// Layouts replayed in this process so far (for tests).
uint64_t LayoutReplays();

/// The HDF5 release that layout replay was written for and checked with.
inline constexpr unsigned kReplayHdf5Major = 1, kReplayHdf5Minor = 10, kReplayHdf5Release = 8;

/// Whether layout replay may run with HDF5 `major.minor.release`: only with
/// the release it was written for (any other may encode its metadata
/// differently).
constexpr bool LayoutReplayFitsHdf5(unsigned major, unsigned minor, unsigned release) {
  return major == kReplayHdf5Major && minor == kReplayHdf5Minor && release == kReplayHdf5Release;
}

/// Whether layout replay runs in this process: compiled against and running
/// with the release of LayoutReplayFitsHdf5. `why_not`, if not null, gets
/// the reason when it does not.
bool LayoutReplayEnabled(std::string* why_not = nullptr);

}  // namespace mhckpt::io
