// The round arithmetic of Comm::GatherBytes across the 2^31 boundary, without
// the memory: every count and displacement fits an int, and the pieces put
// every rank's bytes together exactly once.
#include "base/gather_rounds.h"

#include <gtest/gtest.h>

#include <climits>

namespace mhckpt::internal {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Checks rounds for `sizes`: ints everywhere, each rank's bytes covered in
// order without gaps, no round over `limit`.
void CheckCovers(const std::vector<int64_t>& sizes, int64_t limit) {
  const GatherRounds r = PlanGatherRounds(sizes, limit);
  std::vector<int64_t> next(sizes.size(), 0);
  for (int64_t k = 0; k < r.rounds; ++k) {
    std::optional<GatherLayout> l = GatherRoundLayout(sizes, r, k);
    ASSERT_TRUE(l.has_value()) << "round " << k;
    EXPECT_LE(l->total, std::min<int64_t>(limit, INT_MAX)) << "round " << k;
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto [offset, count] = GatherPiece(sizes[i], r, k);
      EXPECT_EQ(offset, next[i]) << "rank " << i << " round " << k;
      EXPECT_EQ(count, l->counts[i]);
      next[i] += count;
    }
  }
  EXPECT_EQ(next, sizes);
}

TEST(GatherRounds, SmallTotalIsOneRound) {
  GatherRounds r = PlanGatherRounds({5, 0, 7}, kGiB);
  EXPECT_EQ(r.rounds, 1);
  EXPECT_EQ(r.piece, 7);
  CheckCovers({5, 0, 7}, kGiB);
}

TEST(GatherRounds, NothingToSend) { EXPECT_EQ(PlanGatherRounds({0, 0}, kGiB).rounds, 0); }

TEST(GatherRounds, TotalPastTwoGiB) {
  // 8,000 ranks of 600 KB (4.8 GB): the int displacements of one
  // MPI_Gatherv would have overflowed.
  std::vector<int64_t> sizes(8000, 600'000);
  GatherRounds r = PlanGatherRounds(sizes, kGiB);
  EXPECT_GT(r.rounds, 4);
  CheckCovers(sizes, kGiB);
}

TEST(GatherRounds, OneRankPastTwoGiB) {
  // A single rank's count past INT_MAX, beside empty and tiny ranks.
  CheckCovers({3 * kGiB + 5, 0, 1, 2 * kGiB}, kGiB);
  CheckCovers({5 * kGiB}, INT_MAX);
}

TEST(GatherRounds, LimitIsClamped) {
  // A limit beyond int is clamped, so displacements still fit.
  CheckCovers({2 * kGiB, 2 * kGiB}, 8 * kGiB);
  CheckCovers({3, 4, 5}, 3);  // one byte per rank per round
}

}  // namespace
}  // namespace mhckpt::internal
