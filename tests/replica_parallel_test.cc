// Replica-parallel saving (Options::replica_parallel_min_bytes): a big box
// held by several ranks is written as row slices, one per holder, each from
// that holder's own staged copy. Every byte is written once, restores are
// bit-exact, small replicas stay whole on rank 0, replicas are still compared
// whole (verify_replicas), and restore checks the slices' checksums.
// Restores at other world sizes: reshard_rp.* (reshard_test ... rp).
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;
using testing::SumOverRanks;

struct Array {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<Box> boxes;  // held by this rank
  uint64_t seed;
};

Box Rows(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  Box b = FullBox(shape);
  b.start[0] = begin;
  b.count[0] = end - begin;
  return b;
}

uint64_t Bytes(const Array& a) {
  return static_cast<uint64_t>(*Volume(a.shape)) * DTypeSize(a.dtype);
}

uint64_t Bytes(const io::MarkerArray& a, const io::MarkerBox& b) {
  return static_cast<uint64_t>(*Volume(b.box.count)) * DTypeSize(a.dtype);
}

Status SaveAll(CheckpointManager& mgr, int64_t step, const std::vector<Array>& arrays,
               const std::function<void(size_t, std::vector<std::byte>&)>& edit = {}) {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToSave> save;
  bufs.reserve(16);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    ArrayToSave s{a.name, a.dtype, a.shape, {}};
    for (const Box& b : a.boxes) {
      bufs.push_back(Fill(a.dtype, a.shape, b, a.seed));
      if (edit) edit(i, bufs.back());
      s.shards.push_back(Shard{b, bufs.back().data()});
    }
    save.push_back(std::move(s));
  }
  Status s = mgr.Save(step, save);
  for (auto& b : bufs) std::fill(b.begin(), b.end(), std::byte{0xEE});  // Save copied them
  if (!s.ok()) {
    mgr.WaitUntilFinished().IgnoreError();
    return s;
  }
  return mgr.WaitUntilFinished();
}

// Restores `boxes[i]` of each array and compares every byte.
void ExpectRestores(CheckpointManager& mgr, int64_t step, const std::vector<Array>& arrays,
                    const std::vector<std::vector<Box>>& boxes) {
  std::vector<std::vector<std::byte>> bufs;
  bufs.reserve(16);
  std::vector<ArrayToRestore> req;
  for (size_t i = 0; i < arrays.size(); ++i) {
    ArrayToRestore r{arrays[i].name, arrays[i].dtype, {}};
    for (const Box& b : boxes[i]) {
      bufs.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(arrays[i].dtype),
                        std::byte{0x5A});
      r.shards.push_back(Destination{b, bufs.back().data()});
    }
    req.push_back(std::move(r));
  }
  Status s = mgr.Restore(step, req);
  ASSERT_TRUE(s.ok()) << s.ToString();
  size_t k = 0;
  for (size_t i = 0; i < arrays.size(); ++i) {
    for (const Box& b : boxes[i]) {
      EXPECT_TRUE(Fill(arrays[i].dtype, arrays[i].shape, b, arrays[i].seed) == bufs[k++])
          << arrays[i].name << " box " << BoxToString(b) << " on rank " << Rank();
    }
  }
}

// Checks the marker's slices of a box held by `holders` (ascending) that
// covers rows [begin, end): min(k, rows) contiguous near-equal slices, in
// holder order.
void ExpectSlices(const io::MarkerArray& a, int64_t begin, int64_t end,
                  const std::vector<int>& holders) {
  std::vector<const io::MarkerBox*> in;
  for (const io::MarkerBox& b : a.boxes) {
    if (b.box.start[0] >= begin && b.box.start[0] < end) in.push_back(&b);
  }
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(holders.size()), end - begin);
  ASSERT_EQ(static_cast<int64_t>(in.size()), n) << a.name;
  int64_t row = begin;
  for (int64_t i = 0; i < n; ++i) {
    auto [b, e] = SplitRange(end - begin, static_cast<int>(n), static_cast<int>(i));
    EXPECT_EQ(in[i]->box.start[0], row) << a.name << " slice " << i;
    EXPECT_EQ(in[i]->box.count[0], e - b) << a.name << " slice " << i;
    EXPECT_EQ(in[i]->writer, holders[static_cast<size_t>(i)]) << a.name << " slice " << i;
    row += in[i]->box.count[0];
  }
  EXPECT_EQ(row, end);
}

// Every rank's written bytes are exactly those of the boxes the marker gives it.
void ExpectWrittenAsPlanned(const io::Marker& m, uint64_t written_here) {
  uint64_t planned = 0;
  for (const io::MarkerArray& a : m.arrays) {
    for (const io::MarkerBox& b : a.boxes) {
      if (b.writer == Rank()) planned += Bytes(a, b);
    }
  }
  EXPECT_EQ(written_here, planned) << "rank " << Rank();
}

std::vector<int> AllRanks() {
  std::vector<int> r(static_cast<size_t>(Size()));
  for (int i = 0; i < Size(); ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

TEST(ReplicaParallel, ReplicatedArraysAreSplitAmongHoldersAndWrittenOnce) {
  const std::string dir = FreshDir();
  Options o;
  o.replica_parallel_min_bytes = 256;  // every big box in slices of one per holder, up to 16 ranks
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  auto [b, e] = SplitRange(64, p, r);
  std::vector<Array> arrays = {
      {"big2d", DType::kFloat32, {1001, 33}, {FullBox({1001, 33})}, 1},  // uneven rows
      {"big1d", DType::kFloat64, {999}, {FullBox({999})}, 2},
      {"small", DType::kFloat32, {16}, {FullBox({16})}, 3},  // 64 bytes: under the threshold
      {"step", DType::kInt64, {}, {Box{}}, 4},               // a scalar: never split
      {"sharded", DType::kInt32, {64, 8}, {Rows({64, 8}, b, e)}, 5},  // one holder per box
  };
  ASSERT_TRUE(SaveAll(*mgr, 1, arrays).ok());
  const SaveTimings t1 = mgr->LastSaveTimings();

  auto m = io::ReadMarker(io::MarkerPath(dir, 1));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const io::MarkerArray* big2d = m->Find("big2d");
  const io::MarkerArray* big1d = m->Find("big1d");
  ASSERT_TRUE(big2d && big1d);
  EXPECT_TRUE(big2d->replicated);  // every holder had all of it
  ExpectSlices(*big2d, 0, 1001, AllRanks());
  ExpectSlices(*big1d, 0, 999, AllRanks());
  for (const char* name : {"small", "step"}) {
    const io::MarkerArray* a = m->Find(name);
    ASSERT_EQ(a->boxes.size(), 1u) << name;
    EXPECT_EQ(a->boxes[0].box, FullBox(a->shape)) << name;
    EXPECT_EQ(a->boxes[0].writer, 0) << name;
  }
  // (a) Every byte written exactly once, summed over ranks.
  uint64_t total = 0;
  for (const Array& a : arrays) total += Bytes(a);
  EXPECT_EQ(SumOverRanks(t1.written_bytes), total);
  EXPECT_EQ(m->total_bytes, total);
  // (b) Each rank wrote what the marker says, and at np >= 2 a slice of each
  // big array is each holder's.
  ExpectWrittenAsPlanned(*m, t1.written_bytes);

  // (c) Bit-exact: whole (one read on rank 0, broadcast) and in reversed row
  // pieces that cut across the slices.
  ExpectRestores(
      *mgr, 1, arrays,
      {{FullBox({1001, 33})}, {FullBox({999})}, {FullBox({16})}, {Box{}}, {FullBox({64, 8})}});
  auto piece = [&](const std::vector<int64_t>& shape) {
    auto [pb, pe] = SplitRange(shape[0], p + 1, p - r);
    return std::vector<Box>{Rows(shape, pb, pe)};
  };
  ExpectRestores(*mgr, 1, arrays,
                 {piece({1001, 33}), piece({999}), piece({16}), {Box{}}, piece({64, 8})});

  // The cached plan (same boxes everywhere) keeps the slices.
  ASSERT_TRUE(SaveAll(*mgr, 2, arrays).ok());
  EXPECT_TRUE(mgr->LastSaveTimings().plan_cached);
  auto m2 = io::ReadMarker(io::MarkerPath(dir, 2));
  ASSERT_TRUE(m2.ok());
  ExpectSlices(*m2->Find("big2d"), 0, 1001, AllRanks());
  EXPECT_EQ(SumOverRanks(mgr->LastSaveTimings().written_bytes), total);
  ExpectRestores(
      *mgr, 2, arrays,
      {{FullBox({1001, 33})}, {FullBox({999})}, {FullBox({16})}, {Box{}}, {FullBox({64, 8})}});
}

TEST(ReplicaParallel, ShardsHeldByPairsAreSplitWithinEachPair) {
  // (e) Rows [0,50) held by ranks 0 and 1, rows [50,100) by ranks 2 and 3 (at
  // np 3, rank 2 alone; at np 1 and 2, one shard).
  const std::string dir = FreshDir();
  Options o;
  o.replica_parallel_min_bytes = 1;
  o.transfer = Transfer::kCollective;  // uneven box counts per rank must still match up
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const int shards = (p + 1) / 2;
  const std::vector<int64_t> shape{100, 6};
  auto shard = [&](int k) {
    auto [b, e] = SplitRange(100, shards, k);
    return std::pair{b, e};
  };
  auto [b, e] = shard(r / 2);
  std::vector<Array> arrays = {{"w", DType::kFloat32, shape, {Rows(shape, b, e)}, 7}};
  ASSERT_TRUE(SaveAll(*mgr, 1, arrays).ok());

  auto m = io::ReadMarker(io::MarkerPath(dir, 1));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const io::MarkerArray* w = m->Find("w");
  EXPECT_FALSE(w->replicated && shards > 1);
  for (int k = 0; k < shards; ++k) {
    std::vector<int> holders;
    for (int q = 2 * k; q < std::min(p, 2 * k + 2); ++q) holders.push_back(q);
    if (shards == 1) holders = AllRanks();
    auto [sb, se] = shard(k);
    ExpectSlices(*w, sb, se, holders);
  }
  EXPECT_EQ(SumOverRanks(mgr->LastSaveTimings().written_bytes), 100u * 6 * 4);
  ExpectWrittenAsPlanned(*m, mgr->LastSaveTimings().written_bytes);
  if (p >= 2) EXPECT_GT(mgr->LastSaveTimings().written_bytes, 0u) << "rank " << r;
  // Whole on every rank (slices of several writers), and each rank its shard.
  ExpectRestores(*mgr, 1, arrays, {{FullBox(shape)}});
  ExpectRestores(*mgr, 1, arrays, {{Rows(shape, b, e)}});
}

TEST(ReplicaParallel, RankZerosValueDecides) {
  // The plan is made on rank 0 with its options; other ranks' values are ignored.
  const std::vector<int64_t> shape{40, 5};
  std::vector<Array> arrays = {{"r", DType::kFloat32, shape, {FullBox(shape)}, 8}};
  for (bool rank0_splits : {false, true}) {
    const std::string dir = FreshDir(rank0_splits ? "on" : "off");
    Options o;
    o.replica_parallel_min_bytes = (Rank() == 0) == rank0_splits ? 1 : 0;
    auto mgr = OpenForTest(dir, o);
    ASSERT_TRUE(mgr);
    ASSERT_TRUE(SaveAll(*mgr, 1, arrays).ok());
    auto m = io::ReadMarker(io::MarkerPath(dir, 1));
    ASSERT_TRUE(m.ok());
    if (rank0_splits) {
      ExpectSlices(*m->Find("r"), 0, 40, AllRanks());
    } else {
      ASSERT_EQ(m->Find("r")->boxes.size(), 1u);
      EXPECT_EQ(m->Find("r")->boxes[0].writer, 0);
    }
    ExpectWrittenAsPlanned(*m, mgr->LastSaveTimings().written_bytes);
    ExpectRestores(*mgr, 1, arrays, {{FullBox(shape)}});
  }
}

TEST(ReplicaParallel, VerifyReplicasStillComparesAllOfEveryReplica) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  const std::vector<int64_t> shape{30, 4};
  std::vector<Array> arrays = {{"r", DType::kUInt32, shape, {FullBox(shape)}, 9}};
  Options o;
  o.replica_parallel_min_bytes = 1;
  o.verify_replicas = true;
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  ASSERT_TRUE(SaveAll(*mgr, 1, arrays).ok());
  // The last rank's copy differs in row 0, which rank 0 writes: the last
  // rank's own copy of that row is never written, and is still compared.
  Status s = SaveAll(*mgr, 2, arrays, [](size_t, std::vector<std::byte>& buf) {
    if (Rank() == Size() - 1) buf[1] ^= std::byte{1};
  });
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("replicas differ: array 'r' box [0:"));
  EXPECT_THAT(s.message(), HasSubstr("on rank " + std::to_string(Size() - 1)));
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(mgr->CommittedSteps().value(), std::vector<int64_t>{1});
}

TEST(ReplicaParallel, RestoreChecksEverySliceItReadsWhole) {
  const std::vector<int64_t> shape{64, 16};
  std::vector<Array> arrays = {{"r", DType::kFloat32, shape, {FullBox(shape)}, 10}};
  Options o;
  o.replica_parallel_min_bytes = 1;
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  ASSERT_TRUE(SaveAll(*mgr, 1, arrays).ok());
  auto m = io::ReadMarker(io::MarkerPath(dir, 1));
  ASSERT_TRUE(m.ok());
  const io::MarkerBox& last = m->Find("r")->boxes.back();
  if (Rank() == 0) {
    // Flip a byte in the last slice (written by the last rank).
    hid_t f = H5Fopen(io::DataPath(dir, 1).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/r", H5P_DEFAULT);
    haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    off += static_cast<haddr_t>(last.box.start[0]) * 16 * 4 + 3;
    int fd = ::open(io::DataPath(dir, 1).c_str(), O_RDWR);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(off)), 1);
    c ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(off)), 1);
    ::close(fd);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<std::byte> out(64 * 16 * 4);
  // Whole on every rank: read once by rank 0, its slices checked.
  Status s = mgr->Restore(
      1, std::vector<ArrayToRestore>{{"r", DType::kFloat32, {{FullBox(shape), out.data()}}}});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("array 'r' box " + BoxToString(last.box)));
  EXPECT_TRUE(SameOnAllRanks(s));
  // The same read on one rank only (no broadcast).
  std::vector<ArrayToRestore> one{{"r", DType::kFloat32, {}}};
  if (Rank() == 0) one[0].shards.push_back(Destination{FullBox(shape), out.data()});
  s = mgr->Restore(1, one);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
}

}  // namespace
}  // namespace mhckpt
