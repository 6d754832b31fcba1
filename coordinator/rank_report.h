// What a rank tells rank 0 at the end of a phase of the save: its status and
// the checksums of the boxes it hashed (the ones it wrote, for the marker; or
// every box it holds, for the replica check).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "io/marker.h"

namespace mhckpt::internal {

/// The checksum of box `box` of array `array` (indices into the plan), and
/// the checksums of its chunks (io::MarkerBox::chunks; empty in the replica
/// check).
struct BoxSum {
  uint32_t array;
  uint32_t box;
  uint64_t sum;
  std::vector<uint64_t> chunks;
};

/// The checksums of planned box `bi` of array `ai` of the plan, whose bytes
/// are `box`: of the whole box and of each of its chunks
/// (io::MarkerBox::chunks), in one pass while the writer has the bytes at hand.
BoxSum BoxChecksums(const io::MarkerArray& a, size_t ai, size_t bi, std::span<const std::byte> box);

std::string EncodeReport(const Status& s, const std::vector<BoxSum>& sums);

/// Rank 0: every rank's checksums into `sums` (index = rank); returns the
/// first error (lowest rank), noting how many ranks failed.
Status CollectReports(const std::vector<std::string>& reports,
                      std::vector<std::vector<BoxSum>>* sums);

}  // namespace mhckpt::internal
