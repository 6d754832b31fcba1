// Reads by offset (io/pread_reader.h): a restore or verify of a version-2
// step opens no HDF5 dataset, reads many small arrays in a few joined
// requests, packs small replicated arrays into one broadcast, and returns
// the saved bytes exactly — also at another world size and sharding. A step
// without offsets reads through HDF5. Counted with io::Counters().
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/storage.h"
#include "tests/direct_probe.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenAgreed;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;
using testing::SumOverRanks;

constexpr int kArrays = 300;

std::string Name(int i) { return "small/a" + std::to_string(1000 + i); }
std::vector<int64_t> Shape(int i) { return {3 + i % 5, 37}; }  // ~0.5-1 KiB of float32

// Counters since `before`, on this rank.
io::ReadCounters Since(const io::ReadCounters& before) {
  io::ReadCounters now = io::Counters();
  return {now.dataset_opens - before.dataset_opens, now.offset_arrays - before.offset_arrays,
          now.offset_boxes - before.offset_boxes, now.offset_reads - before.offset_reads,
          now.direct_read_bytes - before.direct_read_bytes};
}

// Saves kArrays small arrays as step 1, array i whole on rank i % size
// (`size` ranks of `comm`), plus "rep": replicated, float64 [50, 9].
Status SaveSmall(CheckpointManager& mgr, int rank, int size) {
  std::vector<std::vector<std::byte>> data;
  std::vector<ArrayToSave> arrays;
  data.reserve(kArrays + 1);
  for (int i = 0; i < kArrays; ++i) {
    const Box whole = FullBox(Shape(i));
    std::vector<Shard> shards;
    if (i % size == rank) {
      data.push_back(Fill(DType::kFloat32, Shape(i), whole, i));
      shards.push_back({whole, data.back().data()});
    }
    arrays.push_back({Name(i), DType::kFloat32, Shape(i), shards});
  }
  data.push_back(Fill(DType::kFloat64, {50, 9}, FullBox({50, 9}), 7));
  arrays.push_back(
      {"rep", DType::kFloat64, {50, 9}, {Shard{FullBox({50, 9}), data.back().data()}}});
  MHCKPT_RETURN_IF_ERROR(mgr.Save(1, arrays));
  return mgr.WaitUntilFinished();
}

// This rank's requests: array i whole where i % size == (rank + 1) % size
// (another rank than its writer where there are several), and "rep" whole.
struct Wanted {
  std::vector<std::vector<std::byte>> out;
  std::vector<ArrayToRestore> arrays;
  std::vector<int> index;
};
Wanted WantShifted() {
  Wanted w;
  w.out.reserve(kArrays);
  for (int i = 0; i < kArrays; ++i) {
    if (i % Size() != (Rank() + 1) % Size()) continue;
    const Box whole = FullBox(Shape(i));
    w.out.emplace_back(static_cast<size_t>(*Volume(whole.count)) * 4);
    w.arrays.push_back({Name(i), DType::kFloat32, {{whole, w.out.back().data()}}});
    w.index.push_back(i);
  }
  return w;
}

class Pread : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    mgr_ = OpenForTest(dir_);
    ASSERT_TRUE(mgr_);
    Status s = SaveSmall(*mgr_, Rank(), Size());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Restores `w` (step 1), checks every array's bytes, and returns in `c`
  // the read counters the restore moved.
  void RestoreAndCheck(Wanted& w, io::ReadCounters* c) {
    const io::ReadCounters before = io::Counters();
    Status s = mgr_->Restore(1, w.arrays);
    ASSERT_TRUE(s.ok()) << s.ToString();
    *c = Since(before);
    for (size_t k = 0; k < w.index.size(); ++k) {
      const int i = w.index[k];
      EXPECT_TRUE(w.out[k] == Fill(DType::kFloat32, Shape(i), FullBox(Shape(i)), i)) << Name(i);
    }
  }

  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
};

TEST_F(Pread, ManySmallArraysAreReadByOffsetInFewJoinedRequests) {
  Wanted w = WantShifted();
  io::ReadCounters c;
  ASSERT_NO_FATAL_FAILURE(RestoreAndCheck(w, &c));
  EXPECT_EQ(c.dataset_opens, 0u) << "no HDF5 dataset is opened";
  EXPECT_EQ(c.offset_arrays, static_cast<uint64_t>(kArrays)) << "each array someone wants";
  EXPECT_EQ(c.offset_boxes, w.arrays.size());
  // Joined: far fewer requests than arrays (they lie together in the file).
  EXPECT_GE(w.arrays.size(), 50u);
  EXPECT_LT(c.offset_reads * 10, w.arrays.size()) << c.offset_reads << " reads";
}

TEST_F(Pread, SmallReplicatedArraysArePackedIntoOneBroadcast) {
  // Every array wanted whole on every rank (each was saved whole by one
  // rank: a replicated array): rank 0 reads them all in a few joined
  // requests and broadcasts them in one packet.
  std::vector<std::vector<std::byte>> out;
  std::vector<ArrayToRestore> want;
  out.reserve(kArrays + 1);
  uint64_t total = 0;
  for (int i = 0; i < kArrays; ++i) {
    out.emplace_back(static_cast<size_t>(*Volume(Shape(i))) * 4);
    want.push_back({Name(i), DType::kFloat32, {{FullBox(Shape(i)), out.back().data()}}});
    total += out.back().size();
  }
  out.emplace_back(50 * 9 * 8);
  want.push_back({"rep", DType::kFloat64, {{FullBox({50, 9}), out.back().data()}}});
  total += out.back().size();
  const io::ReadCounters before = io::Counters();
  const uint64_t read_before = io::BytesRead();
  Status s = mgr_->Restore(1, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int i = 0; i < kArrays; ++i) {
    EXPECT_TRUE(out[i] == Fill(DType::kFloat32, Shape(i), FullBox(Shape(i)), i)) << Name(i);
  }
  EXPECT_TRUE(out[kArrays] == Fill(DType::kFloat64, {50, 9}, FullBox({50, 9}), 7));
  const io::ReadCounters c = Since(before);
  EXPECT_EQ(io::BytesRead() - read_before, Rank() == 0 ? total : 0u);
  EXPECT_EQ(c.offset_boxes, Rank() == 0 ? kArrays + 1u : 0u);
  EXPECT_LT(c.offset_reads, Rank() == 0 ? 10u : 1u) << c.offset_reads << " reads";
  EXPECT_EQ(c.dataset_opens, 0u);
}

TEST_F(Pread, VerifyReadsByOffsetAndStillChecksTheDatasets) {
  const io::ReadCounters before = io::Counters();
  uint64_t bytes = 0;
  Status s = mgr_->Verify(1, &bytes);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const io::ReadCounters c = Since(before);
  EXPECT_EQ(c.dataset_opens, kArrays + 1u) << "each dataset checked (collectively)";
  EXPECT_GT(SumOverRanks(c.offset_boxes), 0u);
  EXPECT_LT(SumOverRanks(c.offset_reads) * 10, SumOverRanks(c.offset_boxes));
}

TEST_F(Pread, WithoutOffsetsTheStepIsReadThroughHdf5) {
  ASSERT_TRUE(testing::ForgetOffsets(dir_, 1));
  Wanted w = WantShifted();
  io::ReadCounters c;
  ASSERT_NO_FATAL_FAILURE(RestoreAndCheck(w, &c));
  EXPECT_EQ(c.offset_arrays, 0u);
  EXPECT_GT(c.dataset_opens, 0u);
  EXPECT_TRUE(mgr_->Verify(1).ok());
}

// More small replicated arrays than one packet holds (17 x 4 MiB: a packet
// of 16, then one of 1): every rank gets every byte.
TEST(PreadPackets, ReplicatedArraysBeyondOnePacketArriveWhole) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  constexpr int kBig = 17;
  const std::vector<int64_t> shape{1024, 1024};  // 4 MiB of float32: the largest packed
  std::vector<std::vector<std::byte>> data;
  std::vector<ArrayToSave> arrays;
  data.reserve(kBig);
  for (int i = 0; i < kBig; ++i) {
    std::vector<Shard> shards;
    if (i % Size() == Rank()) {
      data.push_back(Fill(DType::kFloat32, shape, FullBox(shape), 100 + i));
      shards.push_back({FullBox(shape), data.back().data()});
    }
    arrays.push_back({"big" + std::to_string(10 + i), DType::kFloat32, shape, shards});
  }
  ASSERT_TRUE(mgr->Save(1, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  data.clear();
  std::vector<std::vector<std::byte>> out(kBig, std::vector<std::byte>(size_t{4} << 20));
  std::vector<ArrayToRestore> want;
  want.reserve(kBig);
  for (int i = 0; i < kBig; ++i) {
    want.push_back({arrays[i].name, DType::kFloat32, {{FullBox(shape), out[i].data()}}});
  }
  const uint64_t before = io::BytesRead();
  s = mgr->Restore(1, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(io::BytesRead() - before, Rank() == 0 ? kBig * (uint64_t{4} << 20) : 0u);
  for (int i = 0; i < kBig; ++i) {
    EXPECT_TRUE(out[i] == Fill(DType::kFloat32, shape, FullBox(shape), 100 + i)) << i;
  }
}

// Saved by the first half of the ranks (at least one), restored by all with
// another sharding: rows for one array, columns (read through the bounce
// buffer) for another; byte-exact, by offset.
TEST(PreadReshard, SavedOnFewerRanksRestoresOnAllByOffset) {
  const std::string dir = FreshDir();
  const int savers = std::max(1, Size() / 2);
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, Rank() < savers ? 0 : MPI_UNDEFINED, Rank(), &sub);
  const std::vector<int64_t> shape{101, 13};
  int ok = 1;
  if (sub != MPI_COMM_NULL) {
    auto mgr = OpenAgreed(dir, {}, sub);
    auto [lo, hi] = SplitRange(shape[0], savers, Rank());
    const Box mine{{lo, 0}, {hi - lo, shape[1]}};
    auto rows = Fill(DType::kInt32, shape, mine, 3);
    auto cols = Fill(DType::kInt32, shape, mine, 4);
    Status s = mgr.status();
    if (s.ok()) {
      s = (*mgr)->Save(
          1, std::vector<ArrayToSave>{{"r", DType::kInt32, shape, {{mine, rows.data()}}},
                                      {"c", DType::kInt32, shape, {{mine, cols.data()}}}});
      if (s.ok()) s = (*mgr)->WaitUntilFinished();
    }
    ok = s.ok() ? 1 : 0;
    MPI_Comm_free(&sub);
  }
  ASSERT_EQ(SumOverRanks(ok == 1 ? 0 : 1), 0u);
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  auto [r0, r1] = SplitRange(shape[0], Size(), Size() - 1 - Rank());
  auto [c0, c1] = SplitRange(shape[1], Size(), Rank());
  const Box rows{{r0, 0}, {r1 - r0, shape[1]}}, cols{{0, c0}, {shape[0], c1 - c0}};
  std::vector<std::byte> got_r(static_cast<size_t>(*Volume(rows.count)) * 4);
  std::vector<std::byte> got_c(static_cast<size_t>(*Volume(cols.count)) * 4);
  const io::ReadCounters before = io::Counters();
  Status s =
      mgr->Restore(1, std::vector<ArrayToRestore>{{"r", DType::kInt32, {{rows, got_r.data()}}},
                                                  {"c", DType::kInt32, {{cols, got_c.data()}}}});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got_r == Fill(DType::kInt32, shape, rows, 3));
  EXPECT_TRUE(got_c == Fill(DType::kInt32, shape, cols, 4));
  const io::ReadCounters c = Since(before);
  EXPECT_EQ(c.dataset_opens, 0u);
  EXPECT_EQ(c.offset_arrays, 2u);
}

// Saves step 1: "big" (float32, `big`) and "odd" (int16, `odd`), each rank
// its block of rows, filled with seeds `seed` and `seed + 1`.
Status SaveRows(CheckpointManager& mgr, const std::vector<int64_t>& big,
                const std::vector<int64_t>& odd, uint64_t seed) {
  auto [b0, b1] = SplitRange(big[0], Size(), Rank());
  auto [o0, o1] = SplitRange(odd[0], Size(), Rank());
  const Box big_mine{{b0, 0}, {b1 - b0, big[1]}}, odd_mine{{o0, 0}, {o1 - o0, odd[1]}};
  auto a = Fill(DType::kFloat32, big, big_mine, seed);
  auto b = Fill(DType::kInt16, odd, odd_mine, seed + 1);
  MHCKPT_RETURN_IF_ERROR(
      mgr.Save(1, std::vector<ArrayToSave>{{"big", DType::kFloat32, big, {{big_mine, a.data()}}},
                                           {"odd", DType::kInt16, odd, {{odd_mine, b.data()}}}}));
  return mgr.WaitUntilFinished();
}

// Large restores with the read-ahead thread (RestoreOptions::prefault) and
// without: rows of a 24 MiB array on other ranks than their writers (read
// in pieces of at most 8 MiB, two to a request) and columns of a 4.5 MiB one
// (whole chunks into the bounce buffer); byte-exact both ways, the same
// requests, and a failed read (EIO while the thread runs) is the same error
// on every rank, after which the next restore works.
TEST(PreadPrefault, LargeRestoresAreExactWithOrWithoutTheReadAheadThread) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const std::vector<int64_t> big{3072, 2048}, odd{3001, 777};  // float32, int16
  {
    Status s = SaveRows(*mgr, big, odd, 21);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  auto [r0, r1] = SplitRange(big[0], Size(), Size() - 1 - Rank());
  auto [c0, c1] = SplitRange(odd[1], Size(), Rank());
  const Box rows{{r0, 0}, {r1 - r0, big[1]}}, cols{{0, c0}, {odd[0], c1 - c0}};
  uint64_t reads[2] = {0, 0};
  for (bool p : {true, false}) {
    SCOPED_TRACE(p ? "prefault on" : "prefault off");
    std::vector<std::byte> got_r(static_cast<size_t>(*Volume(rows.count)) * 4);
    std::vector<std::byte> got_c(static_cast<size_t>(*Volume(cols.count)) * 2);
    const std::vector<ArrayToRestore> want{{"big", DType::kFloat32, {{rows, got_r.data()}}},
                                           {"odd", DType::kInt16, {{cols, got_c.data()}}}};
    RestoreOptions options;
    options.prefault = p;
    options.direct_reads = false;  // through the page cache: PreadDirect tests those
    const io::ReadCounters before = io::Counters();
    Status s = mgr->Restore(1, want, options);
    ASSERT_TRUE(s.ok()) << s.ToString();
    reads[p ? 0 : 1] = Since(before).offset_reads;
    EXPECT_TRUE(got_r == Fill(DType::kFloat32, big, rows, 21));
    EXPECT_TRUE(got_c == Fill(DType::kInt16, odd, cols, 22));
    // No request longer than 16 MiB: the 24/Size() MiB of rows take several.
    EXPECT_GE(Since(before).offset_reads, (got_r.size() >> 24) + 1);

    ASSERT_TRUE(fault::Configure("point=pread,action=eio").ok());
    s = mgr->Restore(1, want, options);
    ASSERT_TRUE(fault::Configure("").ok());
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
    ASSERT_TRUE(fault::Configure("point=pread,action=short,times=3").ok());
    std::fill(got_r.begin(), got_r.end(), std::byte{0});
    s = mgr->Restore(1, want, options);
    ASSERT_TRUE(fault::Configure("").ok());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(got_r == Fill(DType::kFloat32, big, rows, 21)) << "short reads are resumed";
  }
  EXPECT_EQ(reads[0], reads[1]) << "the same requests either way";
}

// Page-aligned memory, `bytes` of it from `skew` bytes past a page boundary.
class Aligned {
 public:
  Aligned(size_t bytes, size_t skew)
      : base_(static_cast<std::byte*>(std::aligned_alloc(4096, bytes + 4096))),
        bytes_(bytes),
        skew_(skew) {
    std::memset(base_, 0, bytes + 4096);
  }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  ~Aligned() { std::free(base_); }
  std::byte* data() { return base_ + skew_; }
  [[nodiscard]] bool Equals(const std::vector<std::byte>& want) const {
    return want.size() == bytes_ && std::memcmp(base_ + skew_, want.data(), bytes_) == 0;
  }

 private:
  std::byte* base_;
  size_t bytes_;
  size_t skew_;
};

// Drops the file's clean pages from the page cache (no root needed).
void Evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}
// Whether the kernel has cachestat (Linux 6.5).
bool HasCachestat(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  uint64_t range[2] = {0, 4096}, stat[5] = {};
  const bool ok = ::syscall(451, fd, range, stat, 0) == 0;  // __NR_cachestat
  ::close(fd);
  return ok;
}

// The two arrays of the PreadDirect row tests.
const std::vector<int64_t> kBig{3072, 2048};  // float32, rows of 8 KiB
const std::vector<int64_t> kOdd{2001, 777};   // int16, rows of 1554 bytes

// A fresh root holding step 1 of SaveRows(kBig, kOdd, seed); `refused`:
// why its file system takes no O_DIRECT (DirectIoRefused), empty if it does.
struct RowsStep {
  std::string dir, data;
  std::unique_ptr<CheckpointManager> mgr;
  std::string refused;
};
RowsStep SaveRowsStep(uint64_t seed) {
  RowsStep r{FreshDir(), {}, nullptr};
  r.mgr = OpenForTest(r.dir);
  if (!r.mgr) return r;
  Status s = SaveRows(*r.mgr, kBig, kOdd, seed);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) r.mgr.reset();
  r.data = io::DataPath(r.dir, 1);
  r.refused = testing::DirectIoRefused(r.dir);
  return r;
}

// Direct reads (RestoreOptions::direct_reads): rows of a 24 MiB array read
// by other ranks than their writers, into page-aligned memory, go straight
// from the disk — byte-exact; into memory 16 bytes past a page (numpy's
// malloc), directly too, through bounce buffers; with the option off,
// through the page cache; a file
// the page cache holds is read from it; EIO in a direct read is the same
// error on every rank, and short and interrupted direct reads are resumed.
TEST(PreadDirect, AlignedDestinationsReadStraightFromTheDisk) {
  RowsStep step = SaveRowsStep(31);
  ASSERT_TRUE(step.mgr);
  const std::string& data = step.data;
  CheckpointManager* mgr = step.mgr.get();
  const bool direct = step.refused.empty();
  const std::vector<int64_t>& big = kBig;
  const std::vector<int64_t>& odd = kOdd;
  auto [r0, r1] = SplitRange(big[0], Size(), Size() - 1 - Rank());
  auto [q0, q1] = SplitRange(odd[0], Size(), Size() - 1 - Rank());
  const Box rows{{r0, 0}, {r1 - r0, big[1]}}, odd_rows{{q0, 0}, {q1 - q0, odd[1]}};
  const std::vector<std::byte> want = Fill(DType::kFloat32, big, rows, 31);
  const std::vector<std::byte> want_odd = Fill(DType::kInt16, odd, odd_rows, 32);
  // One restore of both into memory `skew` bytes past a page, the file's
  // pages dropped from the cache first unless `warm`; returns the bytes this
  // rank read directly.
  auto restore = [&](size_t skew, bool on, const char* fault, StatusCode code,
                     bool warm = false) -> uint64_t {
    Aligned got(want.size(), skew), got_odd(want_odd.size(), skew);
    if (!warm) Evict(data);
    RestoreOptions options;
    options.direct_reads = on;
    if (fault != nullptr) EXPECT_TRUE(fault::Configure(fault).ok());
    const io::ReadCounters before = io::Counters();
    Status s = mgr->Restore(
        1,
        std::vector<ArrayToRestore>{{"big", DType::kFloat32, {{rows, got.data()}}},
                                    {"odd", DType::kInt16, {{odd_rows, got_odd.data()}}}},
        options);
    const uint64_t read = Since(before).direct_read_bytes;
    EXPECT_TRUE(fault::Configure("").ok());
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
    if (s.ok()) {
      EXPECT_TRUE(got.Equals(want));
      EXPECT_TRUE(got_odd.Equals(want_odd));
    }
    return read;
  };
  const uint64_t aligned = restore(0, true, nullptr, StatusCode::kOk);
  if (direct) {
    // Every row of "big" lines up (8 KiB rows, the dataset aligned); of
    // "odd", at most the whole aligned blocks.
    EXPECT_GE(aligned, want.size());
    EXPECT_LE(aligned, want.size() + want_odd.size());
  } else {
    EXPECT_EQ(aligned, 0u) << "no O_DIRECT here, yet reads went direct";
  }
  // Memory that does not line up: the long runs through bounce buffers,
  // still directly.
  const uint64_t skewed = restore(16, true, nullptr, StatusCode::kOk);
  if (direct) {
    EXPECT_GE(skewed, want.size()) << "memory that does not line up";
  } else {
    EXPECT_EQ(skewed, 0u) << "no O_DIRECT here, yet reads went direct";
  }
  EXPECT_EQ(restore(0, false, nullptr, StatusCode::kOk), 0u) << "direct_reads off";
  restore(0, true, "point=pread,action=eio", StatusCode::kIoError);
  EXPECT_EQ(restore(0, true, "point=pread,action=short,times=3", StatusCode::kOk) > 0, direct);
  EXPECT_EQ(restore(0, true, "point=pread,action=eintr,times=3", StatusCode::kOk) > 0, direct);

  // A file the page cache holds is read from it.
  if (direct && HasCachestat(data)) {
    std::ifstream in(data, std::ios::binary);
    std::vector<char> sink(size_t{1} << 20);
    while (in.read(sink.data(), static_cast<std::streamsize>(sink.size())) || in.gcount() > 0) {
    }
    EXPECT_EQ(restore(0, true, nullptr, StatusCode::kOk, /*warm=*/true), 0u)
        << "the file is in the page cache";
  }
  // The checks above held on the buffered fallback; the direct reads went untested.
  if (!direct) GTEST_SKIP() << step.refused;
}

// Verify reads a cold step straight from the disk (VerifyOptions::
// direct_reads): every byte checked, some of them read directly, none with
// the option off; a byte flipped on the disk is found, the same DataLoss on
// every rank.
TEST(PreadDirect, VerifyReadsAColdStepStraightFromTheDisk) {
  RowsStep step = SaveRowsStep(41);
  ASSERT_TRUE(step.mgr);
  const std::string& dir = step.dir;
  const std::string& data = step.data;
  CheckpointManager* mgr = step.mgr.get();
  const bool direct = step.refused.empty();
  const uint64_t total = static_cast<uint64_t>(kBig[0] * kBig[1] * 4 + kOdd[0] * kOdd[1] * 2);
  // One Verify of the step, its pages dropped from the cache on every rank
  // first; the bytes read directly, over all ranks.
  auto verify = [&](bool on, StatusCode code) -> uint64_t {
    Evict(data);
    MPI_Barrier(MPI_COMM_WORLD);
    VerifyOptions options;
    options.direct_reads = on;
    VerifyReport report;
    const io::ReadCounters before = io::Counters();
    Status s = mgr->Verify(1, options, &report);
    const uint64_t read = SumOverRanks(Since(before).direct_read_bytes);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
    if (s.ok()) EXPECT_EQ(report.bytes_checked, total);
    return read;
  };
  const uint64_t read = verify(true, StatusCode::kOk);
  if (direct) {
    EXPECT_GE(read, uint64_t{4} << 20) << "a cold verify read little from the disk directly";
    EXPECT_LE(read, total);
  } else {
    EXPECT_EQ(read, 0u) << "no O_DIRECT here, yet reads went direct";
  }
  EXPECT_EQ(verify(false, StatusCode::kOk), 0u) << "direct_reads off";

  if (Rank() == 0) {  // one byte in the middle of "big", on the disk
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir, 1));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const int64_t at = m->Find("big")->offset + (int64_t{1536} * 8192) + 77;
    const int fd = ::open(data.c_str(), O_RDWR);
    unsigned char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::fsync(fd);
    ::close(fd);
  }
  EXPECT_EQ(verify(true, StatusCode::kDataLoss) > 0, direct);
  // The checks above held on the buffered fallback; the direct reads went untested.
  if (!direct) GTEST_SKIP() << step.refused;
}

// Small arrays lying together in the file (each whole on one rank) are read
// directly as aligned spans of up to 4 MiB through a bounce buffer and
// copied out: byte-exact at every world size, whatever rank wrote them; EIO
// is the same error on every rank; short and interrupted reads are resumed;
// with direct reads off nothing is read directly.
TEST(PreadDirect, SmallArraysCloseTogetherAreReadThroughABounceBuffer) {
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  constexpr int kSmall = 160;
  auto shape = [](int i) { return std::vector<int64_t>{17 + i % 23, 129}; };  // 8.7-20 KiB
  auto name = [](int i) { return "s/" + std::to_string(1000 + i); };
  {
    std::vector<std::vector<std::byte>> data;
    std::vector<ArrayToSave> arrays;
    data.reserve(kSmall);
    for (int i = 0; i < kSmall; ++i) {
      std::vector<Shard> shards;
      if (i % Size() == Rank()) {
        data.push_back(Fill(DType::kFloat32, shape(i), FullBox(shape(i)), 40 + i));
        shards.push_back({FullBox(shape(i)), data.back().data()});
      }
      arrays.push_back({name(i), DType::kFloat32, shape(i), shards});
    }
    ASSERT_TRUE(mgr->Save(1, arrays).ok());
    Status s = mgr->WaitUntilFinished();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const std::string data = io::DataPath(dir, 1);
  const std::string refused = testing::DirectIoRefused(dir);
  const bool direct = refused.empty();
  // Every rank restores the arrays another rank wrote.
  auto restore = [&](bool on, const char* fault, StatusCode code) -> uint64_t {
    std::vector<std::vector<std::byte>> got;
    std::vector<ArrayToRestore> want;
    got.reserve(kSmall);
    for (int i = 0; i < kSmall; ++i) {
      if ((i + 1) % Size() != Rank()) continue;
      got.emplace_back(static_cast<size_t>(*Volume(shape(i))) * 4, std::byte{0});
      want.push_back({name(i), DType::kFloat32, {{FullBox(shape(i)), got.back().data()}}});
    }
    Evict(data);
    RestoreOptions options;
    options.direct_reads = on;
    if (fault != nullptr) EXPECT_TRUE(fault::Configure(fault).ok());
    const io::ReadCounters before = io::Counters();
    Status s = mgr->Restore(1, want, options);
    const uint64_t read = Since(before).direct_read_bytes;
    EXPECT_TRUE(fault::Configure("").ok());
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_TRUE(testing::SameOnAllRanks(s)) << s.ToString();
    for (size_t k = 0; s.ok() && k < want.size(); ++k) {
      const int i = std::stoi(want[k].name.substr(2)) - 1000;
      EXPECT_TRUE(got[k] == Fill(DType::kFloat32, shape(i), FullBox(shape(i)), 40 + i))
          << want[k].name;
    }
    return read;
  };
  uint64_t mine = 0;
  for (int i = 0; i < kSmall; ++i) {
    if ((i + 1) % Size() == Rank()) mine += static_cast<uint64_t>(*Volume(shape(i))) * 4;
  }
  const uint64_t read = restore(true, nullptr, StatusCode::kOk);
  if (direct) {
    // Each rank's arrays lie side by side (the writer's layout): most of them
    // read directly, and little beyond them (the aligned spans' edges).
    EXPECT_GE(read, mine / 2);
    EXPECT_LE(read, mine + (uint64_t{64} << 10));
  }
  EXPECT_EQ(restore(false, nullptr, StatusCode::kOk), 0u) << "direct_reads off";
  restore(true, "point=pread,action=eio", StatusCode::kIoError);
  EXPECT_EQ(restore(true, "point=pread,action=short,times=3", StatusCode::kOk) > 0, direct);
  EXPECT_EQ(restore(true, "point=pread,action=eintr,times=3", StatusCode::kOk) > 0, direct);
  // The checks above held on the buffered fallback; the direct reads went untested.
  if (!direct) GTEST_SKIP() << refused;
}

}  // namespace
}  // namespace mhckpt
