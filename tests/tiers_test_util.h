// Helpers shared by the tests of the local tier (local_tier_test,
// fallback_test): nodes simulated on one machine and the arrays each rank
// saves at a step.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/types.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"

namespace mhckpt::testing {

// Ranks are put on nodes with Options::node_id: 2 ranks per node at 4 ranks,
// 1 otherwise.
inline int RanksPerNode(int size) { return size == 4 ? 2 : 1; }
inline int NodeOf(int rank, int size) { return rank / RanksPerNode(size); }
inline int NodeCount(int size) { return (size + RanksPerNode(size) - 1) / RanksPerNode(size); }

// The shape of array "w".
inline const std::vector<int64_t> kShape{37, 5};

// Rows of kShape for `part` of `parts`.
inline Box Rows(int parts, int part) {
  auto [b, e] = SplitRange(kShape[0], parts, part);
  return Box{{b, 0}, {e - b, kShape[1]}};
}

// What each rank saves at `step`: its rows of "w" and all of "r" (written by
// rank 0, into w0.bin of a local step).
struct Step {
  std::vector<std::byte> w, r;
  std::vector<ArrayToSave> arrays;
  Step(int64_t step, int rank, int size) {
    const auto seed = static_cast<uint64_t>(step);
    w = Fill(DType::kFloat32, kShape, Rows(size, rank), seed);
    r = Fill(DType::kInt64, {11}, FullBox({11}), seed + 100);
    arrays.push_back({"w", DType::kFloat32, kShape, {Shard{Rows(size, rank), w.data()}}});
    arrays.push_back({"r", DType::kInt64, {11}, {Shard{FullBox({11}), r.data()}}});
  }
};

// Flips the bytes at `at` and `at` + 9 of file `path`.
inline void FlipTwoBytes(const std::string& path, uint64_t at) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  for (uint64_t i : {at, at + 9}) {
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(i)), 1) << path;
    c ^= 0x41;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(i)), 1) << path;
  }
  ::close(fd);
}

// Rank 0 flips two bytes (at `at` and `at` + 9) of writer `writer`'s file of
// local step `step` on each of `nodes` (every node that holds one, if empty);
// returns how many files it damaged (on every rank). A writer's file holds
// its boxes in the order of the arrays' names.
inline int DamageLocal(const std::string& dir, int64_t step, int writer,
                       std::vector<int> nodes = {}, uint64_t at = 3) {
  MPI_Barrier(MPI_COMM_WORLD);
  int damaged = 0;
  if (Rank() == 0) {
    if (nodes.empty()) {
      for (int n = 0; n < NodeCount(Size()); ++n) nodes.push_back(n);
    }
    for (int n : nodes) {
      const std::string path =
          fmt::format("{}/node{}/{}/w{}.bin", dir, n, io::StepDirName(step), writer);
      if (!std::filesystem::exists(path)) continue;
      FlipTwoBytes(path, at);
      ++damaged;
    }
  }
  MPI_Bcast(&damaged, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return damaged;
}

}  // namespace mhckpt::testing

// The tests of the local tier (local_tier_test, fallback_test) live in this
// namespace, with the helpers they share in scope.
namespace mhckpt::tiers_test {

using testing::DamageLocal;
using testing::Fill;
using testing::FlipTwoBytes;
using testing::FreshDir;
using testing::kShape;
using testing::NodeCount;
using testing::NodeOf;
using testing::Rank;
using testing::RanksPerNode;
using testing::Rows;
using testing::SameOnAllRanks;
using testing::Size;
using testing::Step;

}  // namespace mhckpt::tiers_test
