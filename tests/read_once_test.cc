// A box several ranks want is read from storage once: a replicated array that
// every rank restores whole is read by rank 0 and broadcast (MPI into host
// memory here; NCCL between GPUs in gpu_test.cc), and any other box that
// several ranks want exactly is read by one of them and sent to the others
// (a tensor-parallel shard held by every data-parallel copy). Counted with
// io::BytesRead, summed over the ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "base/fault.h"
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
using testing::SumOverRanks;

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

// ---- Boxes wanted by several ranks, not whole arrays ----

constexpr int64_t kTpRows = 600, kTpCols = 40;
const std::vector<int64_t> kTpShape{kTpRows, kTpCols};

// Tensor parallelism of 2 (1 at one rank) times data parallelism of the
// rest: rank r holds half r % 2 of the rows of "t", as do the other ranks of
// its data-parallel group (at 3 ranks, ranks 0 and 2 share half 0).
int Tp() { return Size() >= 2 ? 2 : 1; }
Box TpBox(int rank) {
  auto [lo, hi] = SplitRange(kTpRows, Tp(), rank % Tp());
  return Box{{lo, 0}, {hi - lo, kTpCols}};
}
size_t Bytes(const Box& b, size_t elem) {
  return static_cast<size_t>(Volume(b.count).value_or(0)) * elem;
}

// Rows of "own", int64 [4 * ranks + 3, 5], that rank r holds (and wants).
std::vector<int64_t> OwnShape() { return {4 * Size() + 3, 5}; }
Box OwnBox(int rank) {
  auto [lo, hi] = SplitRange(OwnShape()[0], Size(), rank);
  return Box{{lo, 0}, {hi - lo, 5}};
}

// Saves step 1 in a fresh directory: "t" (float32, halves held as TpBox),
// "own" (row-sharded), "emb" (replicated float32 [1000, 33]) and "rep"
// (replicated int32 [100, 7]). The stored boxes of "t" and "own" are the
// boxes the tests read back, and each is under one checksum chunk (1 MiB),
// so a read of one reads exactly its bytes; "emb" is one chunk too.
std::unique_ptr<CheckpointManager> SaveShared() {
  const int r = Rank();
  auto mgr = OpenForTest(FreshDir());
  if (!mgr) return nullptr;
  const std::vector<int64_t> emb_shape{kRows, kCols}, rep_shape{100, 7};
  auto t = Fill(DType::kFloat32, kTpShape, TpBox(r), 21);
  auto own = Fill(DType::kInt64, OwnShape(), OwnBox(r), 22);
  auto emb = Fill(DType::kFloat32, emb_shape, FullBox(emb_shape), 11);
  auto rep = Fill(DType::kInt32, rep_shape, FullBox(rep_shape), 23);
  std::vector<ArrayToSave> arrays{
      {"t", DType::kFloat32, kTpShape, {Shard{TpBox(r), t.data()}}},
      {"own", DType::kInt64, OwnShape(), {Shard{OwnBox(r), own.data()}}},
      {"emb", DType::kFloat32, emb_shape, {Shard{FullBox(emb_shape), emb.data()}}},
      {"rep", DType::kInt32, rep_shape, {Shard{FullBox(rep_shape), rep.data()}}}};
  EXPECT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return s.ok() ? std::move(mgr) : nullptr;
}

// Collective: restores "t" as TpBox on every rank; the bytes read from
// storage, summed over the ranks.
uint64_t RestoreTp(CheckpointManager& mgr, bool read_once) {
  const Box box = TpBox(Rank());
  std::vector<std::byte> got(Bytes(box, 4));
  ArrayToRestore want{"t", DType::kFloat32, {Destination{box, got.data()}}};
  RestoreOptions options;
  options.read_once = read_once;
  const uint64_t before = io::BytesRead();
  Status s = mgr.Restore(1, {&want, 1}, options);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == Fill(DType::kFloat32, kTpShape, box, 21)) << "rank " << Rank();
  return SumOverRanks(io::BytesRead() - before);
}

TEST(ReadOnce, ShardOfEveryDataParallelCopyIsReadOnce) {
  auto mgr = SaveShared();
  ASSERT_TRUE(mgr);
  uint64_t all = 0;  // every request, each read by the rank that made it
  for (int r = 0; r < Size(); ++r) all += Bytes(TpBox(r), 4);
  // Read once: the distinct boxes, which cover "t" once.
  EXPECT_EQ(RestoreTp(*mgr, true), Bytes(FullBox(kTpShape), 4));
  EXPECT_EQ(RestoreTp(*mgr, false), all);
}

// Keys wanted by one rank ("own"), by a data-parallel group ("t"), by every
// rank but not whole ("emb" rows [0, 500) x columns [3, 13): a read through
// bounce memory), and a replicated array every rank wants whole ("rep", the
// broadcast), in one restore; then the same with read_once off.
TEST(ReadOnce, MixOfKeysWantedByOneRankAndBySeveral) {
  auto mgr = SaveShared();
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const std::vector<int64_t> emb_shape{kRows, kCols}, rep_shape{100, 7};
  const Box emb_box{{0, 3}, {500, 10}};
  const size_t emb_bytes = Bytes(FullBox(emb_shape), 4);  // one chunk: read whole
  const size_t rep_bytes = Bytes(FullBox(rep_shape), 4);
  uint64_t t_all = 0;
  for (int q = 0; q < p; ++q) t_all += Bytes(TpBox(q), 4);
  const uint64_t t_once = Bytes(FullBox(kTpShape), 4);
  const uint64_t own = Bytes(FullBox(OwnShape()), 8);
  for (bool read_once : {true, false}) {
    std::vector<std::byte> t(Bytes(TpBox(r), 4)), o(Bytes(OwnBox(r), 8));
    std::vector<std::byte> e(Bytes(emb_box, 4)), rep(rep_bytes);
    std::vector<ArrayToRestore> want{
        {"emb", DType::kFloat32, {Destination{emb_box, e.data()}}},
        {"own", DType::kInt64, {Destination{OwnBox(r), o.data()}}},
        {"rep", DType::kInt32, {Destination{FullBox(rep_shape), rep.data()}}},
        {"t", DType::kFloat32, {Destination{TpBox(r), t.data()}}}};
    RestoreOptions options;
    options.read_once = read_once;
    const uint64_t before = io::BytesRead();
    Status s = mgr->Restore(1, want, options);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const uint64_t read = SumOverRanks(io::BytesRead() - before);
    if (read_once) {
      EXPECT_EQ(read, t_once + own + emb_bytes + rep_bytes);
    } else {
      EXPECT_EQ(read, t_all + own + p * (emb_bytes + rep_bytes));
    }
    EXPECT_TRUE(t == Fill(DType::kFloat32, kTpShape, TpBox(r), 21)) << "rank " << r;
    EXPECT_TRUE(o == Fill(DType::kInt64, OwnShape(), OwnBox(r), 22)) << "rank " << r;
    EXPECT_TRUE(e == Fill(DType::kFloat32, emb_shape, emb_box, 11)) << "rank " << r;
    EXPECT_TRUE(rep == Fill(DType::kInt32, rep_shape, FullBox(rep_shape), 23)) << "rank " << r;
  }
}

// Every rank wants the same two boxes (pure data parallelism over a sharded
// layout): each box read once in all, the reads spread over the ranks.
TEST(ReadOnce, EveryRankWantsTheSameBoxes) {
  auto mgr = SaveShared();
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  std::vector<std::byte> got(Bytes(FullBox(kTpShape), 4));
  std::vector<Destination> dests;
  size_t at = 0;
  for (int g = 0; g < Tp(); ++g) {
    dests.push_back(Destination{TpBox(g), got.data() + at});
    at += Bytes(TpBox(g), 4);
  }
  ArrayToRestore want{"t", DType::kFloat32, dests};
  const uint64_t before = io::BytesRead();
  Status s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  const uint64_t mine = io::BytesRead() - before;
  EXPECT_EQ(SumOverRanks(mine), Bytes(FullBox(kTpShape), 4));
  // Two boxes at two or more ranks: read by two different ranks.
  if (p >= 2) EXPECT_EQ(SumOverRanks(mine > 0 ? 1 : 0), 2u);
  at = 0;
  for (int g = 0; g < Tp(); ++g) {
    const size_t n = Bytes(TpBox(g), 4);
    std::vector<std::byte> part(got.begin() + static_cast<ptrdiff_t>(at),
                                got.begin() + static_cast<ptrdiff_t>(at + n));
    EXPECT_TRUE(part == Fill(DType::kFloat32, kTpShape, TpBox(g), 21)) << "rank " << r;
    at += n;
  }
}

// The reader of a box every rank wants fails its read (EIO; armed on every
// rank, only the reader reads): it still sends, nobody hangs, and every rank
// returns the reader's error, one rank failed. Then the step restores.
TEST(ReadOnce, ReadFailureOnTheReaderIsTheSameErrorEverywhere) {
  auto mgr = SaveShared();
  ASSERT_TRUE(mgr);
  const int r = Rank();
  const std::vector<int64_t> emb_shape{kRows, kCols};
  const Box rows{{0, 0}, {500, kCols}};
  std::vector<std::byte> got(Bytes(rows, 4));
  ArrayToRestore want{"emb", DType::kFloat32, {Destination{rows, got.data()}}};
  ASSERT_TRUE(fault::Configure("point=pread,action=eio").ok());
  const uint64_t before = io::BytesRead();
  Status s = mgr->Restore(1, {&want, 1});
  const bool fired = fault::Fired() > 0;
  ASSERT_TRUE(fault::Configure("").ok());
  const uint64_t read = io::BytesRead() - before;
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_THAT(s.message(), ::testing::MatchesRegex("rank [0-9]+: step 1: array 'emb' box .*"));
  EXPECT_THAT(s.message(), ::testing::Not(::testing::HasSubstr("more rank")));
  EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
  EXPECT_EQ(SumOverRanks(fired ? 1 : 0), 1u) << "one reader";
  if (fired) {
    EXPECT_THAT(s.message(), ::testing::StartsWith(fmt::format("rank {}: ", r)));
  } else {
    EXPECT_EQ(read, 0u) << "rank " << r << " read for itself";
  }
  s = mgr->Restore(1, {&want, 1});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == Fill(DType::kFloat32, emb_shape, rows, 11)) << "rank " << r;
}

}  // namespace
}  // namespace mhckpt
