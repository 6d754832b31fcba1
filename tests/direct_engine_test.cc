// The data paths of a save (Options::data_path; io/direct_engine.h,
// io/raw_writer.h): every path writes the same plain HDF5 file. Each case
// saves arrays whose bytes are predictable (testing::Fill), restores every
// array whole on every rank and compares byte for byte. The arrays cover the
// awkward cases of the direct path: rows that are not page multiples (the
// aligned middle of a run comes from an unaligned staged address: bounce
// buffer), boxes cut in the second dimension (one short run per row), boxes
// cut in two dimensions of a 3-D array, large aligned runs, 0-d arrays, empty
// arrays, bool, bfloat16 and float8.
//
// DataPaths.KeepForReaders also leaves its checkpoint and the expected bytes
// of every array (expected/<name with '/' as '.'>.bin) under
// $MHCKPT_TEST_DIR/np<N>/direct_for_readers, for tests/direct_read_test.py
// (h5py and h5dump).
#include <mpi.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "io/direct_engine.h"
#include "io/layout.h"
#include "io/marker.h"
#include "tests/direct_probe.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;

constexpr uint64_t kSeed = 13;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The arrays of every case.
std::vector<Spec> Specs() {
  return {
      {"rows/f32", DType::kFloat32, {1500, 1037}},     // 6.2 MB, odd row length
      {"cols/u16", DType::kUInt16, {700, 4099}},       // cut by columns
      {"aligned/f64", DType::kFloat64, {1024, 1024}},  // 8 MiB, page-multiple rows
      {"blocks/i32", DType::kInt32, {64, 96, 40}},     // cut in two dimensions
      {"small/bool", DType::kBool, {17}},              // replicated
      {"small/bf16", DType::kBFloat16, {33}},          // replicated
      {"small/f8_e4m3", DType::kFloat8E4M3, {9, 3}},   // replicated
      {"scalar/i64", DType::kInt64, {}},               // 0-d, replicated
      {"empty/f32", DType::kFloat32, {0, 5}},          // no elements
      {"half/f16", DType::kFloat16, {3, 1 << 20}},     // 6 MiB, cut by columns
  };
}

// The boxes of `s` that this rank saves.
std::vector<Box> MyBoxes(const Spec& s) {
  const int n = Size(), r = Rank();
  Box box = FullBox(s.shape);
  if (s.name.starts_with("rows/") || s.name.starts_with("aligned/")) {
    auto [b, e] = SplitRange(s.shape[0], n, r);
    box.start[0] = b;
    box.count[0] = e - b;
  } else if (s.name.starts_with("cols/") || s.name.starts_with("half/")) {
    auto [b, e] = SplitRange(s.shape[1], n, r);
    box.start[1] = b;
    box.count[1] = e - b;
  } else if (s.name.starts_with("blocks/")) {
    // Two boxes per rank: rows of this rank, split in two along dimension 1.
    auto [b, e] = SplitRange(s.shape[0], n, r);
    std::vector<Box> boxes;
    for (int half = 0; half < 2; ++half) {
      auto [c0, c1] = SplitRange(s.shape[1], 2, half);
      boxes.push_back(Box{{b, c0, 0}, {e - b, c1 - c0, s.shape[2]}});
    }
    return boxes;
  } else if (s.name.starts_with("empty/")) {
    return {};
  } else if (r != 0) {
    return {box};  // replicated: every rank holds it, rank 0 writes it
  }
  return {box};
}

// Saves every array of `specs` at `step` and restores each whole on every
// rank.
void SaveAndRestore(CheckpointManager& m, int64_t step, const std::vector<Spec>& specs = Specs()) {
  CheckpointManager* mgr = &m;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<ArrayToSave> arrays;
  buffers.reserve(64);
  for (const Spec& s : specs) {
    arrays.push_back(ArrayToSave{s.name, s.dtype, s.shape, {}});
    for (const Box& b : MyBoxes(s)) {
      if (Volume(b.count).value() == 0) continue;
      buffers.push_back(Fill(s.dtype, s.shape, b, kSeed + step));
      arrays.back().shards.push_back(Shard{b, buffers.back().data()});
    }
  }
  ASSERT_TRUE(mgr->Save(step, arrays).ok());
  Status w = mgr->WaitUntilFinished();
  ASSERT_TRUE(w.ok()) << w.ToString();
  for (const Spec& s : specs) {
    const Box whole = FullBox(s.shape);
    std::vector<std::byte> got(static_cast<size_t>(Volume(s.shape).value()) * DTypeSize(s.dtype),
                               std::byte{0xAB});
    ArrayToRestore want{s.name, s.dtype, {}};
    if (!got.empty()) want.shards.push_back(Destination{whole, got.data()});
    Status r = mgr->Restore(step, std::vector<ArrayToRestore>{want});
    ASSERT_TRUE(r.ok()) << s.name << ": " << r.ToString();
    EXPECT_TRUE(got == Fill(s.dtype, s.shape, whole, kSeed + step))
        << s.name << " differs on rank " << Rank();
  }
}

struct PathCase {
  DataPath path;
  int threads;
};

class DataPaths : public ::testing::TestWithParam<PathCase> {};

// Two saves of the same arrays on one manager: the second reuses the pool's
// threads and bounce buffers and, on the direct engine (direct and buffered
// paths), replays rank 0's layout (io/dataset_layout.h). Verify then opens
// every dataset of the replayed step through HDF5 and checks its dtype, shape
// and offset against the marker, and every byte against its checksums.
//
// On a file system that refuses O_DIRECT the direct path writes through the
// page cache: the checks hold, and the case reports itself skipped.
TEST_P(DataPaths, RestoreEqualsSaved) {
  Options o;
  o.data_path = GetParam().path;
  o.writer_threads = GetParam().threads;
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 1));
  const uint64_t replays = io::LayoutReplays();
  ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 2));
  const bool direct_engine = GetParam().path != DataPath::kHdf5;
  const bool replays_here = Rank() == 0 && io::LayoutReplayEnabled();  // io/dataset_layout.h
  EXPECT_EQ(io::LayoutReplays() - replays, replays_here && direct_engine ? 1u : 0u);
  uint64_t checked = 0;
  Status v = mgr->Verify(2, &checked);
  ASSERT_TRUE(v.ok()) << v.ToString();
  EXPECT_GT(checked, 0u);
  const std::string refused = testing::DirectIoRefused(dir);
  if (GetParam().path == DataPath::kDirect && !refused.empty()) GTEST_SKIP() << refused;
}

// A save whose arrays differ from the last one's in one shape lays out
// through HDF5 again (no replay), at other offsets, and restores exactly;
// the save after it, of the same arrays again, replays that new layout.
TEST(LayoutReplay, AnyDifferentArrayLaysOutAgain) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 1));
  std::vector<Spec> other = Specs();
  other[2].shape = {1024, 1000};  // "aligned/f64", smaller: the arrays after it move
  uint64_t replays = io::LayoutReplays();
  ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 2, other));
  EXPECT_EQ(io::LayoutReplays(), replays);
  ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 3, other));
  EXPECT_EQ(io::LayoutReplays() - replays, Rank() == 0 && io::LayoutReplayEnabled() ? 1u : 0u);
  for (int64_t step : {2, 3}) {
    Status v = mgr->Verify(step);
    EXPECT_TRUE(v.ok()) << "step " << step << ": " << v.ToString();
  }
}

// Small arrays, each held whole by one rank, taken in turn: rank 0 lays the
// datasets out grouped by writer, so each rank's arrays lie side by side in
// the file (one run its writes join, io/raw_writer.h), in the first layout
// and in the replayed one; every byte restores and verifies.
TEST(LayoutByWriter, EachRanksSmallArraysLieSideBySide) {
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  constexpr int kArrays = 48;
  const std::vector<int64_t> shape{250, 3};  // 3,000 bytes: never a page
  for (int64_t step : {1, 2}) {
    std::vector<std::vector<std::byte>> buffers(kArrays);
    std::vector<ArrayToSave> arrays;
    for (int i = 0; i < kArrays; ++i) {
      arrays.push_back(ArrayToSave{fmt::format("small/{:02d}", i), DType::kInt32, shape, {}});
      if (i % Size() != Rank()) continue;
      buffers[i] = Fill(DType::kInt32, shape, FullBox(shape), kSeed + step + i);
      arrays.back().shards.push_back(Shard{FullBox(shape), buffers[i].data()});
    }
    ASSERT_TRUE(mgr->Save(step, arrays).ok());
    Status w = mgr->WaitUntilFinished();
    ASSERT_TRUE(w.ok()) << w.ToString();
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir, step));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::map<int, std::vector<std::pair<int64_t, int64_t>>> by_writer;  // [begin, end)
    for (const io::MarkerArray& a : m->arrays) {
      ASSERT_EQ(a.boxes.size(), 1u) << a.name;
      ASSERT_GE(a.offset, 0) << a.name;
      by_writer[a.boxes[0].writer].emplace_back(a.offset, a.offset + 3000);
    }
    EXPECT_EQ(by_writer.size(), static_cast<size_t>(std::min(Size(), kArrays)));
    for (auto& [writer, extents] : by_writer) {
      std::sort(extents.begin(), extents.end());
      for (size_t k = 1; k < extents.size(); ++k) {
        EXPECT_EQ(extents[k].first, extents[k - 1].second)
            << "step " << step << ": rank " << writer << "'s arrays are not side by side";
      }
    }
    for (int i = 0; i < kArrays; ++i) {
      std::vector<std::byte> got(3000, std::byte{0xAB});
      ArrayToRestore want{fmt::format("small/{:02d}", i), DType::kInt32, {}};
      want.shards.push_back(Destination{FullBox(shape), got.data()});
      Status r = mgr->Restore(step, std::vector<ArrayToRestore>{want});
      ASSERT_TRUE(r.ok()) << r.ToString();
      EXPECT_TRUE(got == Fill(DType::kInt32, shape, FullBox(shape), kSeed + step + i))
          << "small/" << i << " differs on rank " << Rank();
    }
    Status v = mgr->Verify(step);
    EXPECT_TRUE(v.ok()) << "step " << step << ": " << v.ToString();
  }
}

// Named Direct_1, Direct_4, Buffered_3, Hdf5_0 (path and writer threads):
// ctest runs the Direct cases as direct_engine.direct.npN, reported skipped
// where the file system refuses O_DIRECT.
INSTANTIATE_TEST_SUITE_P(All, DataPaths,
                         ::testing::Values(PathCase{DataPath::kDirect, 1},
                                           PathCase{DataPath::kDirect, 4},
                                           PathCase{DataPath::kBuffered, 3},
                                           PathCase{DataPath::kHdf5, 0}),
                         [](const ::testing::TestParamInfo<PathCase>& info) {
                           const DataPath p = info.param.path;
                           const char* path = p == DataPath::kDirect     ? "Direct"
                                              : p == DataPath::kBuffered ? "Buffered"
                                                                         : "Hdf5";
                           return fmt::format("{}_{}", path, info.param.threads);
                         });

// The default path, left on disk with the expected bytes for h5py and h5dump.
TEST(DataPathsForReaders, KeepForReaders) {
  const char* base = std::getenv("MHCKPT_TEST_DIR");
  const std::string dir =
      fmt::format("{}/np{}/direct_for_readers", base ? base : "/tmp/mhckpt-test", Size());
  if (Rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Options o;
    o.max_to_keep = 1;  // step 7 alone is left: its file is a replayed layout
    auto mgr = OpenForTest(dir, o);
    ASSERT_TRUE(mgr);
    ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 6));
    ASSERT_NO_FATAL_FAILURE(SaveAndRestore(*mgr, 7));
  }
  if (Rank() != 0) return;
  std::filesystem::create_directories(dir + "/expected");
  for (const Spec& s : Specs()) {
    std::string file = s.name;
    for (char& c : file) c = c == '/' ? '.' : c;
    std::ofstream out(fmt::format("{}/expected/{}.bin", dir, file), std::ios::binary);
    auto bytes = Fill(s.dtype, s.shape, FullBox(s.shape), kSeed + 7);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace
}  // namespace mhckpt
