// Reads of a committed step that check every byte they return: the restore's
// read path (coordinator/restore.cc). A stored box of a version-2 step is cut
// into chunks of whole rows, each with its own checksum in the commit marker
// (docs/FORMAT.md); a read of any part of it reads the whole chunks around
// that part, checks each, and copies out the part asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "io/marker.h"
#include "io/storage.h"

namespace mhckpt::internal {

/// Bytes moved by checked reads, for tests and benchmarks.
struct CheckedReadStats {
  uint64_t read = 0;     ///< read from storage (whole chunks)
  uint64_t checked = 0;  ///< of them, hashed and compared with the marker
};

/// Reads `want` of array `a` (opened as `handle` in `reader`) into the
/// row-major buffer `out`, checking every chunk of every stored box it reads
/// against the marker's chunk checksums. Chunks that lie whole, as a run of
/// rows, in `want` are read straight into `out`; the others into `bounce`
/// (grown as needed, up to 64 MiB or one chunk) and copied out. Needs a
/// version-2 marker. DataLoss naming the array, the stored box, the chunk and
/// the rank that wrote it on a mismatch; the reader's errors as they come.
Status ReadChecked(io::StepReader& reader, size_t handle, const io::MarkerArray& a, const Box& want,
                   std::byte* out, std::vector<std::byte>& bounce,
                   CheckedReadStats* stats = nullptr);

/// Copies `region` (inside both boxes) from the row-major bytes of `src_box`
/// at `src` to those of `dst_box` at `dst`; elements of `elem` bytes.
void CopyRegion(const std::byte* src, const Box& src_box, std::byte* dst, const Box& dst_box,
                const Box& region, size_t elem);

}  // namespace mhckpt::internal
