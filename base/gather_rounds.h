// How Comm::GatherBytes moves any number of bytes through MPI calls whose
// counts and displacements are `int` (Open MPI 4.1 has no MPI-4 large-count
// calls): in rounds. In round k every rank sends bytes [k*piece, (k+1)*piece)
// of its own (fewer at its end), so no count exceeds `piece` and no
// displacement at the root exceeds ranks * piece <= the round limit. Pure
// arithmetic, without MPI, so a test can cross 2^31 without the memory.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace mhckpt::internal {

/// Bytes one round may move to the root at most (counts and displacements
/// stay below INT_MAX).
inline constexpr int64_t kGatherRoundBytes = int64_t{1} << 30;

struct GatherRounds {
  int64_t piece = 0;   ///< bytes a rank sends per round at most
  int64_t rounds = 0;  ///< how many rounds (0 when every rank sends nothing)
};

/// The rounds for ranks sending `sizes` bytes (index = rank), each round
/// moving at most `limit` bytes (clamped to [1, INT_MAX]): one round when
/// the total fits, else pieces of limit / ranks bytes.
GatherRounds PlanGatherRounds(const std::vector<int64_t>& sizes, int64_t limit);

/// {offset, length} of the bytes a rank with `size` bytes sends in `round`.
std::pair<int64_t, int64_t> GatherPiece(int64_t size, const GatherRounds& r, int64_t round);

/// The root's counts and displacements for `round`, as MPI_Gatherv takes
/// them; nullopt if any would not fit an int (never, for rounds from
/// PlanGatherRounds).
struct GatherLayout {
  std::vector<int> counts;
  std::vector<int> displs;
  int64_t total = 0;
};
std::optional<GatherLayout> GatherRoundLayout(const std::vector<int64_t>& sizes,
                                              const GatherRounds& r, int64_t round);

}  // namespace mhckpt::internal
