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
#include "io/step_index.h"

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
/// The bytes of each chunk BoxChecksums hashes planned box `b` in, whose
/// bytes are `box_bytes` (a copy that hashed in these chunks gives the same
/// checksums).
size_t BoxChunkBytes(const io::MarkerBox& b, size_t box_bytes);

std::string EncodeReport(const Status& s, const std::vector<BoxSum>& sums);

/// Rank 0: every rank's checksums into `sums` (index = rank); returns the
/// first error (lowest rank), noting how many ranks failed.
Status CollectReports(const std::vector<std::string>& reports,
                      std::vector<std::vector<BoxSum>>* sums);

/// Rank 0: every (array, box) index that ranks reported lies inside the plan.
Status CheckSumsInPlan(const io::Marker& plan, const std::vector<std::vector<BoxSum>>& sums);

/// Rank 0, format 2: every rank's outcome, and the checksums of the boxes
/// each wrote, into `plan` (the commit, and the local tier's).
Status FillChecksums(const std::vector<std::string>& reports, io::Marker* plan);

/// Rank 0, format 3: every rank's outcome, and the check word of each box's
/// index record (BoxSum::sum, no chunks), each box reported exactly once,
/// into `plan`'s index entry (io::MarkerIndex).
Status FillIndex(const std::vector<std::string>& reports, const io::IndexLayout& layout,
                 io::Marker* plan);

}  // namespace mhckpt::internal
