// Comm::GatherBytes in many rounds: a round limit of a few bytes makes the
// gather of uneven, empty and large descriptions take the same path that
// descriptions past 2 GiB take (base/gather_rounds.h).
#include <mpi.h>

#include <gtest/gtest.h>

#include "base/comm.h"

namespace mhckpt::internal {
namespace {

// Rank r's bytes: uneven lengths (rank 1 sends nothing), recognisable contents.
std::string BytesOf(int r) {
  std::string s(static_cast<size_t>(r == 1 ? 0 : (r * 37 + 11) % 100 + r * 1000), '\0');
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = static_cast<char>((i * 7 + static_cast<size_t>(r)) % 251);
  return s;
}

TEST(Comm, GatherBytesInRounds) {
  Comm comm = Comm::Duplicate(MPI_COMM_WORLD);
  for (int64_t limit : {int64_t{1}, int64_t{7}, int64_t{1000}, kGatherRoundBytes}) {
    for (int root : {0, comm.size() - 1}) {
      std::vector<std::string> all = comm.GatherBytes(BytesOf(comm.rank()), root, limit);
      if (comm.rank() != root) {
        EXPECT_TRUE(all.empty());
        continue;
      }
      ASSERT_EQ(all.size(), static_cast<size_t>(comm.size()));
      for (int r = 0; r < comm.size(); ++r) {
        EXPECT_EQ(all[static_cast<size_t>(r)], BytesOf(r)) << "rank " << r << " limit " << limit;
      }
    }
  }
}

}  // namespace
}  // namespace mhckpt::internal
