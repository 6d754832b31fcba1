// A box several ranks want is read from storage once: a replicated array that
// every rank restores whole is read by rank 0 and broadcast (MPI into host
// memory here; NCCL between GPUs in gpu_test.cc). Counted with io::BytesRead.
#include <gtest/gtest.h>

#include "coordinator/checkpoint_manager.h"
#include "io/storage.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;

constexpr int64_t kRows = 1000, kCols = 33;

// Saves "emb" (replicated, float32 [1000, 33]) and "w" (row-sharded int64
// [4 * ranks + 3, 5]) as step 1 in a fresh directory.
std::unique_ptr<CheckpointManager> SaveStep() {
  const int p = Size(), r = Rank();
  auto mgr = OpenForTest(FreshDir());
  if (!mgr) return nullptr;
  const std::vector<int64_t> emb_shape{kRows, kCols}, w_shape{4 * p + 3, 5};
  auto emb = Fill(DType::kFloat32, emb_shape, FullBox(emb_shape), 11);
  auto [lo, hi] = SplitRange(w_shape[0], p, r);
  Box mine{{lo, 0}, {hi - lo, 5}};
  auto w = Fill(DType::kInt64, w_shape, mine, 12);
  std::vector<ArrayToSave> arrays{
      {"emb", DType::kFloat32, emb_shape, {Shard{FullBox(emb_shape), emb.data()}}},
      {"w", DType::kInt64, w_shape, {Shard{mine, w.data()}}}};
  EXPECT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return s.ok() ? std::move(mgr) : nullptr;
}

TEST(ReadOnce, ReplicatedArrayWantedWholeEverywhereIsReadByRankZeroOnly) {
  auto mgr = SaveStep();
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const std::vector<int64_t> emb_shape{kRows, kCols};
  std::vector<std::byte> emb(kRows * kCols * 4);
  ArrayToRestore want{"emb", DType::kFloat32, {Destination{FullBox(emb_shape), emb.data()}}};
  const uint64_t before = io::BytesRead();
  Status s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  const uint64_t read = io::BytesRead() - before;
  EXPECT_EQ(read, r == 0 ? emb.size() : 0u) << "rank " << r << " of " << p;
  EXPECT_TRUE(emb == Fill(DType::kFloat32, emb_shape, FullBox(emb_shape), 11));
}

TEST(ReadOnce, PartialRequestsAreReadByEachRank) {
  auto mgr = SaveStep();
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const std::vector<int64_t> emb_shape{kRows, kCols};
  // Every rank wants its own rows of the replicated array: no broadcast, each
  // rank reads for itself.
  auto [lo, hi] = SplitRange(kRows, p, (r + 1) % p);
  Box rows{{lo, 0}, {hi - lo, kCols}};
  std::vector<std::byte> got(static_cast<size_t>(hi - lo) * kCols * 4);
  ArrayToRestore want{"emb", DType::kFloat32, {Destination{rows, got.data()}}};
  const uint64_t before = io::BytesRead();
  Status s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  // At least its own rows; more where checked reads take whole chunks.
  EXPECT_GE(io::BytesRead() - before, got.size());
  EXPECT_TRUE(got == Fill(DType::kFloat32, emb_shape, rows, 11));
}

}  // namespace
}  // namespace mhckpt
