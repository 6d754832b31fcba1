// Where each dataset's bytes lie in a file that the pwriting writers
// (io/direct_writer.h, io/subfile_writer.h) fill: the one place that lays
// such a file out. The rank that lays a file out creates its datasets
// through HDF5's POSIX driver (contiguous, allocated at creation, never
// filled, large ones aligned), closes it (HDF5 writes its metadata) and
// returns a layout vector, which the writer broadcasts:
//   [outcome (1: ok), end of the data, offset of each dataset or -1]
//
// - LayOutArrays: one dataset per array, grouped by writer (ArraySpec::
//   writer): HDF5 packs small datasets created one after another, so each
//   rank's small arrays lie side by side and its writes join into long runs.
// - A subfile (data-<g>.h5, StorageOptions::ranks_per_file): SubfileBoxes
//   picks the boxes group g writes, by writer, and LayOutSubfile lays them
//   out as arrays of their own (box_<array>_<box>, the box's shape).
// - data.h5 beside subfiles: LayOutVirtualFile makes one HDF5 virtual
//   dataset per array mapping its boxes onto the subfiles (HDF5 1.10's file
//   format), so tools reading data.h5 see the global arrays.
//
// Layout replay: the laying-out rank keeps the bytes HDF5 wrote for the last
// layout (LayoutSkeleton) — the file outside the arrays' extents
// (superblock, groups, object headers; the holes of alignment gaps are
// skipped with SEEK_DATA), a few MiB for 10,000 arrays, at most 64 MiB —
// with the layout itself. A save of the same arrays (names, dtypes, shapes,
// writers, boxes, in the same order: every step of a training run) writes
// those bytes into the new file instead of creating every dataset again,
// since HDF5 would write the same metadata at the same addresses: nothing in
// it depends on the step. (The one difference: HDF5's object timestamps are
// those of the first layout.) For 10,000 arrays this takes the 0.4-0.6 s of
// dataset creation off every save after the first (docs/PERFORMANCE.md,
// "Measurements behind the defaults"). Any array that differs lays out
// through HDF5 again; so does a new manager. A subfile's group replays its
// subfile, and rank 0 data.h5 (nothing but metadata).
//
// The kept bytes are HDF5's private on-disk encoding (object headers, global
// heap, superblock checksum), and "HDF5 would write the same bytes" has been
// checked with one release only, 1.10.8 (Debian's). So replay runs only where
// the HDF5 that mhckpt was compiled against (CMake reads its version into
// MHCKPT_HDF5_BUILD_*) and the one loaded at run time (H5get_libversion) are
// both that release; otherwise every save lays out through HDF5, and the
// laying-out rank says so once in the log.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "io/h5_file.h"
#include "io/storage.h"

namespace mhckpt::io {

/// The last layout made of one file (see above): the arrays it was made for,
/// its layout vector, the file's length once HDF5 closed it, and every byte
/// HDF5 had written — the file outside the arrays' extents, which no rank
/// writes. Kept by the engine across saves.
class LayoutSkeleton {
 public:
  /// Whether a layout of `arrays` can be replayed from here.
  [[nodiscard]] bool Fits(std::span<const ArraySpec> arrays) const;
  [[nodiscard]] const std::vector<int64_t>& layout() const { return layout_; }

  /// Keeps the layout HDF5 just wrote to `path` for `arrays`. Anything that
  /// goes wrong leaves nothing kept: the next save lays out through HDF5.
  void Capture(const std::string& path, std::span<const ArraySpec> arrays,
               const std::vector<int64_t>& layout);
  /// Writes the kept bytes over `path` (truncated first) and sets its
  /// length: the file HDF5 would have left.
  [[nodiscard]] Status WriteTo(const std::string& path) const;
  void Clear();

 private:
  bool KeepWritten(int fd, uint64_t from, uint64_t to, uint64_t* kept);
  bool ReadPiece(int fd, uint64_t offset, uint64_t size);

  std::vector<ArraySpec> arrays_;
  std::vector<int64_t> layout_;  // as broadcast: [1, end, offsets...]
  uint64_t file_bytes_ = 0;
  std::vector<std::pair<uint64_t, std::string>> pieces_;
};

/// Lays `arrays` out in `file` (created at `path`), one dataset each, by
/// writer, and closes it; fills `layout` (arrays.size() + 2 entries, [0]
/// set to 1). Replayed from `skeleton` when it fits, else captured there.
/// Why closing before anyone writes is safe: HDF5 never writes raw data here
/// (no fill, no H5Dwrite), its metadata lies outside every dataset, and a
/// page is written either only directly or only through the page cache
/// (io/raw_writer.h), so metadata and array bytes sharing a page meet in the
/// page cache.
Status LayOutArrays(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                    LayoutSkeleton& skeleton, std::vector<int64_t>& layout);

/// One box of one array (ArraySpec::boxes).
struct StoredBoxRef {
  size_t array = 0;
  size_t box = 0;
};

/// The boxes stored in subfile `group`: those whose writer is in it
/// (`group_of_rank`, by rank), by writer, so that a rank's boxes lie side by
/// side. Their order is the subfile's layout vector's.
std::vector<StoredBoxRef> SubfileBoxes(std::span<const ArraySpec> arrays,
                                       std::span<const int> group_of_rank, int group);

/// The dataset of box `box` of array `array` in its subfile: "box_3_0".
std::string BoxDatasetName(size_t array, size_t box);

/// A subfile's layout: `boxes` (SubfileBoxes), each a dataset of its own,
/// laid out as LayOutArrays lays out arrays.
Status LayOutSubfile(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                     std::span<const StoredBoxRef> boxes, LayoutSkeleton& skeleton,
                     std::vector<int64_t>& layout);

/// data.h5 beside subfiles: one virtual dataset per array mapping its boxes
/// onto the subfiles (`group_of_rank` names each writer's), closed. Nothing
/// but metadata: replayed whole from `skeleton` for the same arrays, boxes
/// and writers.
Status LayOutVirtualFile(H5File& file, const std::string& path, std::span<const ArraySpec> arrays,
                         std::span<const int> group_of_rank, LayoutSkeleton& skeleton);

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
