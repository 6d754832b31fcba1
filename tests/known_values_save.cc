// Saves two steps (41 and 42) of arrays with known values, at any world size,
// for readers that do not use mhckpt: tests/h5py_read_test.py checks them with
// h5py and numpy, tests/cli_test.py runs the mhckpt CLI on them.
//
//   mpiexec -n N known_values_save DIR
//   mpiexec -n N known_values_save DIR --replay
//   mpiexec -n N known_values_save DIR --format 2
//
// With --replay it saves steps 41 to 45 instead, of the same arrays, so that
// rank 0 replays the layout of step 41 (io/direct_engine.h) four times; it
// fails unless it did, writes the count to DIR/layout_replays, and exits 77
// (skipped) where this build or the HDF5 loaded does not replay. With
// --format it writes that format version (Options::format_version); with
// --files K, a subfile per K ranks (Options::files).
//
// The values are spelled out in h5py_read_test.py too; change both together.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "io/direct_engine.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::OpenAgreed;

// Holds the buffers behind the arrays of one save.
class Arrays {
 public:
  explicit Arrays(int ranks, int rank) : ranks_(ranks), rank_(rank) {}

  // `values` is the whole array, row-major; this rank saves the rows of
  // dimension 0 that SplitRange gives it (or the whole array when replicated).
  template <typename T>
  void Add(std::string name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& values,
           bool replicated) {
    static_assert(std::is_trivially_copyable_v<T>);
    Box box = FullBox(shape);
    if (!replicated) {
      auto [b, e] = SplitRange(shape[0], ranks_, rank_);
      box.start[0] = b;
      box.count[0] = e - b;
    }
    const int64_t row = shape.empty() ? 1 : Volume(shape).value() / std::max<int64_t>(shape[0], 1);
    const int64_t first = box.start.empty() ? 0 : box.start[0] * row;
    const int64_t n = Volume(box.count).value();
    arrays_.push_back(ArrayToSave{std::move(name), dtype, std::move(shape), {}});
    if (n == 0) return;  // this rank holds no rows of it
    buffers_.emplace_back(static_cast<size_t>(n) * sizeof(T));
    std::memcpy(buffers_.back().data(), values.data() + first, buffers_.back().size());
    arrays_.back().shards.push_back(Shard{std::move(box), buffers_.back().data()});
  }

  // Saves a float64 [3, 4] array split by columns instead of rows (2-D boxes).
  void AddByColumns(const std::string& name, const std::vector<double>& values) {
    auto [b, e] = SplitRange(4, ranks_, rank_);
    arrays_.push_back(ArrayToSave{name, DType::kFloat64, {3, 4}, {}});
    if (e == b) return;
    std::vector<double> part;
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = b; j < e; ++j) part.push_back(values[static_cast<size_t>(i * 4 + j)]);
    }
    buffers_.emplace_back(part.size() * sizeof(double));
    std::memcpy(buffers_.back().data(), part.data(), buffers_.back().size());
    arrays_.back().shards.push_back(Shard{Box{{0, b}, {3, e - b}}, buffers_.back().data()});
  }

  [[nodiscard]] const std::vector<ArrayToSave>& arrays() const { return arrays_; }

 private:
  int ranks_, rank_;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<ArrayToSave> arrays_;
};

Arrays KnownValues(int64_t step, int ranks, int rank) {
  Arrays a(ranks, rank);
  std::vector<float> arange(35);
  for (size_t i = 0; i < arange.size(); ++i) arange[i] = static_cast<float>(step * 1000 + i);
  a.Add("values/f32_arange", DType::kFloat32, {7, 5}, arange, false);
  // bfloat16 bits of 1.5, -2.0, 3.140625, 0.0, +inf, -1.0.
  a.Add("values/bf16", DType::kBFloat16, {6},
        std::vector<uint16_t>{0x3FC0, 0xC000, 0x4049, 0x0000, 0x7F80, 0xBF80}, false);
  // float16 bits of 0.5, -1.25, 65504, 2^-14.
  a.Add("values/f16", DType::kFloat16, {4}, std::vector<uint16_t>{0x3800, 0xBD00, 0x7BFF, 0x0400},
        true);
  a.Add("values/i64", DType::kInt64, {5},
        std::vector<int64_t>{-1, 0, (int64_t{1} << 40) + 3, std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int64_t>::max()},
        false);
  std::vector<uint8_t> mask(9);
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % 3 == 0 ? 1 : 0;
  a.Add("values/bool", DType::kBool, {9}, mask, false);
  a.Add("values/u64", DType::kUInt64, {3},
        std::vector<uint64_t>{0, (uint64_t{1} << 63) + 5, std::numeric_limits<uint64_t>::max()},
        true);
  std::vector<double> grid(12);
  for (size_t k = 0; k < grid.size(); ++k) grid[k] = 10.0 * (k / 4) + (k % 4) + 0.25;
  a.AddByColumns("values/f64_cols", grid);
  // float8_e4m3fn bits of 1.0, -2.0, 448; float8_e5m2 bits of 1.0, -2.0.
  a.Add("values/f8_e4m3", DType::kFloat8E4M3, {3}, std::vector<uint8_t>{0x38, 0xC0, 0x7E}, true);
  a.Add("values/f8_e5m2", DType::kFloat8E5M2, {2}, std::vector<uint8_t>{0x3C, 0xC0}, true);
  a.Add("scalar/step", DType::kInt64, {}, std::vector<int64_t>{step}, true);
  std::vector<int32_t> cube(24);
  for (size_t i = 0; i < cube.size(); ++i) cube[i] = -static_cast<int32_t>(i);
  a.Add("nested/deep/path/i32", DType::kInt32, {2, 3, 4}, cube, false);
  return a;
}

constexpr int kSkipped = 77;

// Rank 0 with --replay: that `replays` layouts were replayed, into
// DIR/layout_replays for h5py_read_test.py --replayed.
int CheckReplays(const std::string& dir, uint64_t replays, uint64_t expected) {
  if (replays != expected) {
    return fmt::print(stderr, "layout replayed {} times, expected {}\n", replays, expected), 1;
  }
  std::FILE* f = std::fopen((dir + "/layout_replays").c_str(), "w");
  if (f == nullptr) return fmt::print(stderr, "cannot write {}/layout_replays\n", dir), 1;
  fmt::print(f, "{}\n", replays);
  std::fclose(f);
  fmt::print("layout replayed {} times\n", replays);
  return 0;
}

int Run(const std::string& dir, int ranks, int rank, bool replay, int format, int ranks_per_file) {
  std::string why_not;
  if (replay && !io::LayoutReplayEnabled(&why_not)) {
    if (rank == 0) fmt::print("no layout replay here: {}\n", why_not);
    return kSkipped;
  }
  if (rank == 0) std::filesystem::remove_all(dir);  // a fresh checkpoint every run
  MPI_Barrier(MPI_COMM_WORLD);
  Options options;
  if (format > 0) options.format_version = format;
  options.files.ranks_per_file = ranks_per_file;
  auto mgr = OpenAgreed(dir, options);
  if (!mgr.ok()) return fmt::print(stderr, "open: {}\n", mgr.status().ToString()), 1;
  const std::vector<int64_t> steps =
      replay ? std::vector<int64_t>{41, 42, 43, 44, 45} : std::vector<int64_t>{41, 42};
  const uint64_t replays_before = io::LayoutReplays();
  for (int64_t step : steps) {
    Arrays arrays = KnownValues(step, ranks, rank);
    Status s = (*mgr)->Save(step, arrays.arrays(),
                            {{"test", "known_values"}, {"step", std::to_string(step)}});
    if (s.ok()) s = (*mgr)->WaitUntilFinished();
    if (!s.ok()) return fmt::print(stderr, "rank {}: save {}: {}\n", rank, step, s.ToString()), 1;
  }
  if (rank == 0) fmt::print("saved steps 41 to {} at {} ranks in {}\n", steps.back(), ranks, dir);
  if (replay && rank == 0) {
    // With subfiles rank 0 replays two layouts per save: its group's subfile and data.h5.
    const uint64_t per_save = ranks_per_file > 0 ? 2 : 1;
    return CheckReplays(dir, io::LayoutReplays() - replays_before, per_save * (steps.size() - 1));
  }
  return 0;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) {
  return mhckpt::testing::RunJob(argc, argv, [](int argc, char** argv, int p, int r) {
    int rc = 2;
    bool replay = false, ok = argc >= 2;
    int format = 0, files = 0;
    for (int i = 2; ok && i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--replay") {
        replay = true;
      } else if ((flag == "--format" || flag == "--files") && i + 1 < argc) {
        (flag == "--format" ? format : files) = std::atoi(argv[++i]);
      } else {
        ok = false;
      }
    }
    if (ok) {
      rc = mhckpt::Run(argv[1], p, r, replay, format, files);
    } else if (r == 0) {
      std::fprintf(stderr,
                   "usage: known_values_save DIR [--replay] [--format VERSION] [--files RANKS]\n");
    }
    return rc;
  });
}
