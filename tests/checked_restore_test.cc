// Restore checks every byte it returns, at any sharding and world size
// (RestoreOptions::verify_checksums, coordinator/checked_read.h): a byte
// flipped inside a stored box is an agreed DataLoss naming the array, the box,
// the chunk, the rank that wrote it and the rank that read it, whether the
// read covers the stored box or part of it. Each job of N ranks also restores
// as jobs of 1-4 other ranks would (their destinations dealt to its ranks).
#include <fcntl.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "base/checksum.h"
#include "coordinator/checked_read.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/step_index.h"
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

// "w": float32 rows of 24 bytes, chunks of 8 rows (200-byte chunk size).
const std::vector<int64_t> kRows{40, 6};
// "cols": int32 [12, 10], saved split by columns.
const std::vector<int64_t> kCols{12, 10};
constexpr uint64_t kChunkBytes = 200;

// Part `part` of `parts` of `shape` cut along dimension `dim`.
Box Part(const std::vector<int64_t>& shape, int dim, int parts, int part) {
  Box box = FullBox(shape);
  auto [b, e] = SplitRange(shape[static_cast<size_t>(dim)], parts, part);
  box.start[static_cast<size_t>(dim)] = b;
  box.count[static_cast<size_t>(dim)] = e - b;
  return box;
}

// The boxes a job of `world` ranks asks for when each takes its part of
// `shape` along `dim`, dealt to this job's ranks (part p to rank p % Size()).
std::vector<Box> AsWorld(const std::vector<int64_t>& shape, int dim, int world) {
  std::vector<Box> mine;
  for (int p = Rank(); p < world; p += Size()) mine.push_back(Part(shape, dim, world, p));
  return mine;
}

// Each test runs at both format versions a save writes: 2 (chunk checksums
// in the commit marker) and 3 (in the step's index file).
class CheckedRestore : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    Options o;
    o.checksum_chunk_bytes = kChunkBytes;
    o.format_version = GetParam();
    mgr_ = OpenForTest(dir_, o);
    ASSERT_TRUE(mgr_);
    Box rows = Part(kRows, 0, Size(), Rank());
    Box cols = Part(kCols, 1, Size(), Rank());
    w_ = Fill(DType::kFloat32, kRows, rows, 1);
    cols_ = Fill(DType::kInt32, kCols, cols, 2);
    step_ = Fill(DType::kInt64, {}, Box{}, 3);
    std::vector<ArrayToSave> arrays{{"w", DType::kFloat32, kRows, {Shard{rows, w_.data()}}},
                                    {"cols", DType::kInt32, kCols, {Shard{cols, cols_.data()}}},
                                    {"step", DType::kInt64, {}, {Shard{Box{}, step_.data()}}}};
    ASSERT_TRUE(mgr_->Save(1, arrays).ok());
    Status s = mgr_->WaitUntilFinished();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Step 1's marker with every checksum: format 3 reads them from the index.
  io::Marker MarkerWithChecksums() {
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir_, 1));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    if (m->format_version >= 3) {
      Status s = io::LoadIndex(io::IndexPath(dir_, 1), &*m);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return *m;
  }

  // Restores `boxes` of array `name` and compares them with what was saved
  // (`*same`); returns the agreed outcome.
  Status RestoreAndCompare(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                           const std::vector<Box>& boxes, uint64_t seed, bool* same,
                           const RestoreOptions& options = {}) {
    std::vector<std::vector<std::byte>> out;
    ArrayToRestore request{name, dtype, {}};
    for (const Box& b : boxes) {
      out.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(dtype));
      request.shards.push_back({b, out.back().data()});
    }
    Status s = mgr_->Restore(1, std::vector<ArrayToRestore>{request}, options);
    *same = true;
    for (size_t i = 0; i < boxes.size(); ++i) {
      *same = *same && out[i] == Fill(dtype, shape, boxes[i], seed);
    }
    return s;
  }

  // Flips one byte of element (row, 0) of "w", at the offset the marker
  // records (rank 0; everyone waits).
  void FlipRow(int64_t row) {
    if (Rank() == 0) {
      Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir_, 1));
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      const int64_t at = m->Find("w")->offset + row * 24 + 1;
      int fd = ::open(io::DataPath(dir_, 1).c_str(), O_RDWR);
      unsigned char c = 0;
      ASSERT_EQ(::pread(fd, &c, 1, at), 1);
      c ^= 0x40;
      ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
      ::close(fd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
  std::vector<std::byte> w_, cols_, step_;
};

std::string VersionName(const ::testing::TestParamInfo<int>& info) {
  return "v" + std::to_string(info.param);
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckedRestore, ::testing::Values(2, 3), VersionName);

TEST_P(CheckedRestore, MarkerHasChunksAndOffsets) {
  Result<io::Marker> read = io::ReadMarker(io::MarkerPath(dir_, 1));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->format_version, GetParam());
  EXPECT_EQ(read->chunk_bytes, kChunkBytes);
  for (const io::MarkerArray& a : read->arrays) {
    EXPECT_GT(a.offset, 0) << a.name;
    for (const io::MarkerBox& b : a.boxes) {
      EXPECT_EQ(b.chunk_rows, io::ChunkRows(b.box, a.dtype, kChunkBytes)) << a.name;
      // Format 3: the checksums are in the index, not the marker.
      if (GetParam() >= 3) {
        EXPECT_TRUE(b.chunks.empty()) << a.name;
        EXPECT_EQ(b.checksum, 0u) << a.name;
      }
    }
  }
  // Every chunk's checksum is that of the bytes saved.
  const io::Marker m = MarkerWithChecksums();
  const std::vector<std::pair<std::string, uint64_t>> seeds{{"w", 1}, {"cols", 2}, {"step", 3}};
  for (const auto& [name, seed] : seeds) {
    const io::MarkerArray* a = m.Find(name);
    ASSERT_NE(a, nullptr) << name;
    for (const io::MarkerBox& b : a->boxes) {
      ASSERT_EQ(b.chunks.size(), io::ChunkCount(b.box, b.chunk_rows)) << name;
      std::vector<std::byte> whole = Fill(a->dtype, a->shape, b.box, seed);
      EXPECT_EQ(b.checksum, Checksum(whole.data(), whole.size())) << name;
      for (size_t c = 0; c < b.chunks.size(); ++c) {
        Box chunk = b.box;
        if (!chunk.start.empty()) {
          chunk.start[0] += static_cast<int64_t>(c) * b.chunk_rows;
          chunk.count[0] = std::min(b.chunk_rows, b.box.start[0] + b.box.count[0] - chunk.start[0]);
        }
        std::vector<std::byte> bytes = Fill(a->dtype, a->shape, chunk, seed);
        EXPECT_EQ(b.chunks[c], Checksum(bytes.data(), bytes.size()))
            << name << " box " << BoxToString(b.box) << " chunk " << c;
      }
    }
  }
  EXPECT_EQ(m.Find("w")->boxes[0].chunk_rows, 8);
  EXPECT_TRUE(mgr_->Verify(1).ok());
}

// Format 3: a reader loads the index records of the boxes it reads, and
// nothing else of the index.
TEST_P(CheckedRestore, IndexSourceLoadsOnlyTheRecordsAsked) {
  if (GetParam() < 3) GTEST_SKIP() << "format 3 only";
  Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir_, 1));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Result<io::IndexLayout> layout = io::IndexLayout::Of(*m, "the marker");
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  const io::MarkerArray* w = m->Find("w");
  ASSERT_NE(w, nullptr);
  const size_t wi = static_cast<size_t>(w - m->arrays.data());
  const size_t last = w->boxes.size() - 1;
  internal::IndexSource index(io::IndexPath(dir_, 1), &*m);
  std::vector<std::pair<const io::MarkerArray*, const io::MarkerBox*>> want{{w, &w->boxes[last]}};
  Status s = index.Load(want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(index.records(), layout->record_bytes(wi, last));
  EXPECT_LT(index.records(), m->index.bytes);
  for (const io::MarkerArray& a : m->arrays) {
    for (const io::MarkerBox& b : a.boxes) {
      EXPECT_EQ(b.chunks.empty(), &b != &w->boxes[last]) << a.name << " " << BoxToString(b.box);
    }
  }
  std::vector<std::byte> bytes = Fill(DType::kFloat32, kRows, w->boxes[last].box, 1);
  EXPECT_EQ(w->boxes[last].checksum, Checksum(bytes.data(), bytes.size()));
  // Loaded once: asked again, nothing more is read.
  s = index.Load(want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(index.records(), layout->record_bytes(wi, last));
}

TEST_P(CheckedRestore, EveryLayoutOfEveryWorldSizeReadsTheSavedBytes) {
  for (int world = 1; world <= 5; ++world) {
    for (bool verify : {true, false}) {
      SCOPED_TRACE(fmt::format("as {} ranks, verify {}", world, verify));
      RestoreOptions o;
      o.verify_checksums = verify;
      bool same = false;
      // Rows as rows, rows as columns (every chunk read through the bounce
      // buffer), columns as rows, and the 0-d array.
      Status s =
          RestoreAndCompare("w", DType::kFloat32, kRows, AsWorld(kRows, 0, world), 1, &same, o);
      EXPECT_TRUE(s.ok() && same) << s.ToString();
      s = RestoreAndCompare("w", DType::kFloat32, kRows, AsWorld(kRows, 1, world), 1, &same, o);
      EXPECT_TRUE(s.ok() && same) << s.ToString();
      s = RestoreAndCompare("cols", DType::kInt32, kCols, AsWorld(kCols, 0, world), 2, &same, o);
      EXPECT_TRUE(s.ok() && same) << s.ToString();
      s = RestoreAndCompare("cols", DType::kInt32, kCols, AsWorld(kCols, 1, world), 2, &same, o);
      EXPECT_TRUE(s.ok() && same) << s.ToString();
      s = RestoreAndCompare("step", DType::kInt64, {}, {Box{}}, 3, &same, o);
      EXPECT_TRUE(s.ok() && same) << s.ToString();
    }
  }
}

// A byte flipped inside a stored box, read back as part of other boxes
// (another world size), must not be returned unchecked.
TEST_P(CheckedRestore, FlippedByteIsDataLossAtEveryWorldSize) {
  const int64_t row = 13;
  FlipRow(row);
  int writer = 0;
  while (SplitRange(kRows[0], Size(), writer).second <= row) ++writer;
  const Box stored = Part(kRows, 0, Size(), writer);
  const int64_t chunk = (row - stored.start[0]) / 8;
  const int64_t first = stored.start[0] + chunk * 8;
  const std::string what =
      fmt::format("array 'w' box {} chunk {} (rows {}..{}): checksum mismatch", BoxToString(stored),
                  chunk, first, std::min(first + 8, stored.start[0] + stored.count[0]));
  for (int world = 1; world <= 4; ++world) {
    for (int dim : {0, 1}) {
      SCOPED_TRACE(fmt::format("as {} ranks, split along {}", world, dim));
      bool same = false;
      Status s =
          RestoreAndCompare("w", DType::kFloat32, kRows, AsWorld(kRows, dim, world), 1, &same);
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_THAT(s.message(), HasSubstr(what));
      EXPECT_THAT(s.message(), HasSubstr(fmt::format("(written by rank {})", writer)));
      EXPECT_THAT(s.message(), ::testing::StartsWith("rank "));
      EXPECT_TRUE(SameOnAllRanks(s)) << s.ToString();
    }
  }
  // Reads that do not touch the damaged chunk are fine (row 0 never shares
  // its chunk with row 13 here).
  bool same = false;
  Status s = RestoreAndCompare("w", DType::kFloat32, kRows, {Box{{0, 2}, {1, 3}}}, 1, &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
  // Unchecked, the damage comes through.
  RestoreOptions unchecked;
  unchecked.verify_checksums = false;
  s = RestoreAndCompare("w", DType::kFloat32, kRows, {FullBox(kRows)}, 1, &same, unchecked);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(same);
  EXPECT_EQ(mgr_->Verify(1).code(), StatusCode::kDataLoss);
}

// Verify checks the chunk checksums too: a step whose chunk checksums
// disagree with the file (its box checksums agreeing) fails Verify, not only
// a restore. Format 2: the marker's chunk list, forged; format 3: the index,
// forged whole (each record's check word and the index checksum in the
// marker agreeing with it).
TEST_P(CheckedRestore, VerifyChecksEveryChunk) {
  if (Rank() == 0) {
    io::Marker m = MarkerWithChecksums();
    for (io::MarkerArray& a : m.arrays) {
      if (a.name == "w") {
        ASSERT_GE(a.boxes[0].chunks.size(), 2u);
        a.boxes[0].chunks[1] ^= 1;
      }
    }
    if (m.format_version >= 3) {
      std::string index = io::IndexHeader(m.step);
      std::vector<uint64_t> checks;
      for (size_t a = 0; a < m.arrays.size(); ++a) {
        for (size_t b = 0; b < m.arrays[a].boxes.size(); ++b) {
          const io::MarkerBox& box = m.arrays[a].boxes[b];
          checks.push_back(io::AppendIndexRecord(a, b, box.checksum, box.chunks, &index));
        }
      }
      ASSERT_EQ(index.size(), m.index.bytes);
      m.index.checksum = io::IndexChecksum(checks);
      std::ofstream(io::IndexPath(dir_, 1), std::ios::binary | std::ios::trunc) << index;
    }
    std::ofstream(io::MarkerPath(dir_, 1), std::ios::trunc) << io::MarkerToJson(m);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const Box stored = Part(kRows, 0, Size(), 0);
  const std::string what = fmt::format("array 'w' box {} chunk 1 (rows 8..", BoxToString(stored));
  Status s = mgr_->Verify(1);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(what));
  EXPECT_TRUE(SameOnAllRanks(s));
  // A restore reading those rows finds it too; one reading only chunk 0 not.
  bool same = false;
  s = RestoreAndCompare("w", DType::kFloat32, kRows, {Box{{9, 0}, {1, 6}}}, 1, &same);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(what));
  EXPECT_TRUE(SameOnAllRanks(s));
  s = RestoreAndCompare("w", DType::kFloat32, kRows, {Box{{0, 0}, {8, 6}}}, 1, &same);
  EXPECT_TRUE(s.ok() && same) << s.ToString();
}

TEST(CopyRegion, MovesASubBoxBetweenLayouts) {
  // src: rows 2..6, cols 0..4 of an int32 grid; dst: rows 3..8, cols 1..3.
  const Box src_box{{2, 0}, {4, 4}}, dst_box{{3, 1}, {5, 2}}, region{{3, 1}, {3, 2}};
  std::vector<int32_t> src(16), dst(10, -1);
  for (int i = 0; i < 16; ++i) src[static_cast<size_t>(i)] = (2 + i / 4) * 10 + i % 4;
  internal::CopyRegion(reinterpret_cast<const std::byte*>(src.data()), src_box,
                       reinterpret_cast<std::byte*>(dst.data()), dst_box, region, 4);
  EXPECT_EQ(dst, (std::vector<int32_t>{31, 32, 41, 42, 51, 52, -1, -1, -1, -1}));
}

}  // namespace
}  // namespace mhckpt
