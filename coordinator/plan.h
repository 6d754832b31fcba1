// The plan round of a save: what every rank holds, checked against what every
// other rank holds, and exactly one writer for each distinct box.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "io/marker.h"
#include "worker/snapshot.h"

namespace mhckpt::internal {

struct ArrayDescription {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<Box> boxes;
};

/// What one rank tells rank 0 in the plan round.
struct RankDescription {
  int64_t step = 0;
  Status status;  ///< the rank's local error (from its snapshot), carried along
  std::vector<ArrayDescription> arrays;
};

RankDescription Describe(int64_t step, const Status& local, const Snapshot& snapshot);
std::string EncodeDescription(const RankDescription& d);
Result<RankDescription> DecodeDescription(const std::string& bytes);

/// What a rank holds, independent of the step: equal hashes, equal plans.
/// Streamed over the snapshot's fields, without encoding a description.
uint64_t DescriptionHash(const Snapshot& snapshot);

/// A box of an array and the rank that messages name with it (its holder in
/// a plan, its writer in a marker).
struct RankedBox {
  const Box* box;
  int rank;
};

/// InvalidArgument unless the distinct non-empty `boxes` of array `name` of
/// `shape` cover every element exactly once: no partial overlap, no hole.
/// The plan's check of every save, and verify's of every stored step.
Status CheckTiling(const std::string& name, const std::vector<int64_t>& shape,
                   std::vector<RankedBox> boxes);

/// Validates the descriptions of all ranks (index = rank) and returns the
/// plan as the marker-to-be: arrays sorted by name, each distinct non-empty box
/// once, with its writer. Deterministic. Errors, in this order: a rank's own
/// error (the lowest rank's); ranks disagreeing on the step; an array missing
/// on some rank; dtype or shape disagreeing; a name that is also a group
/// ("a" and "a/b"); boxes overlapping partially; holes in the coverage.
///
/// Writers: a box held by one rank is written by it. The boxes held by
/// several ranks are then given out largest first (ties in name and box
/// order): a box covering the whole array (a fully replicated array) to rank
/// 0 if it holds it, any other to the holder with the fewest bytes assigned
/// so far (lowest rank on ties).
///
/// Replica-parallel saving (`replica_parallel_min_bytes` > 0): a box held by
/// k >= 2 ranks, of at least that many bytes and with at least 2 rows (first
/// dimension), is planned as n contiguous row slices of near-equal size (the
/// first ones one row longer): n = min(k, rows, bytes / min_bytes), at least
/// 2, so no slice is much under `replica_parallel_min_bytes` and the plan
/// does not grow with k. Slice i is written by the i-th, in rank order, of
/// the n least loaded holders (all of them when n = k). Each slice is a box of
/// its own in the plan (and the marker). The array's `replicated` flag still
/// says whether every holder held the whole array.
Result<io::Marker> BuildPlan(const std::vector<RankDescription>& ranks,
                             uint64_t replica_parallel_min_bytes = 0,
                             uint64_t chunk_bytes = io::kChunkBytes);

/// The same plan from the distinct descriptions only: rank r described
/// `layouts[layout_of_rank[r]]` (data-parallel replicas share one). Each
/// layout is checked once, so planning costs O(layouts x arrays + ranks x
/// boxes per rank) instead of O(ranks x arrays); errors name the lowest rank
/// with the offending layout, as BuildPlan(ranks) does.
Result<io::Marker> BuildPlan(const std::vector<RankDescription>& layouts,
                             const std::vector<int>& layout_of_rank,
                             uint64_t replica_parallel_min_bytes = 0,
                             uint64_t chunk_bytes = io::kChunkBytes);

/// `box` cut along dimension 0 into min(parts, rows) contiguous slices of
/// near-equal row counts, in order (the first `rows % n` one row longer).
/// Fewer than 2 slices: `box` itself.
std::vector<Box> SplitRows(const Box& box, int parts);

/// Where `part` lies in the row-major bytes of `whole` (`whole_bytes` of
/// them) when `part` is a run of whole rows of `whole` — the same extent in
/// every dimension but the first, and inside it in the first: {offset,
/// length} in bytes. nullopt otherwise, and for 0-d or row-less boxes. The
/// slices of SplitRows are such runs, as is `whole` itself.
std::optional<std::pair<size_t, size_t>> RowRunBytes(const Box& whole, const Box& part,
                                                     size_t whole_bytes);

}  // namespace mhckpt::internal
