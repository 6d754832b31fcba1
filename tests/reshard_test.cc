// The N-to-M matrix, across real jobs:
//   mpiexec -n N reshard_test save DIR       saves a checkpoint at N ranks
//   mpiexec -n M reshard_test restore DIR    restores it at M ranks, checks every byte
//   mpiexec -n M reshard_test damaged DIR    restores a copy with one byte of block/2d
//                                            flipped: an agreed DataLoss on every rank
//   mpiexec -n M reshard_test lost DIR sub2  restores a copy without its last
//                                            subfile: the same
// ctest runs every (N, M) in 1..4 x 1..4 (tests/CMakeLists.txt). With a last
// argument `rp`, the save uses replica-parallel saving
// (Options::replica_parallel_min_bytes) and both sides add arrays that it
// splits: a big replicated one, and one sharded over pairs of ranks. With
// `f2`, format 2; with `sub2`, subfiles of two ranks each (Options::files),
// which the restore checks are there.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "io/step_index.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::OpenAgreed;

struct Spec {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t seed;
};

bool replica_parallel = false;  // the `rp` argument
int format_version = 3;         // the `f2` argument: 2 (what the save writes, the restore expects)
int ranks_per_file = 0;         // the `sub2` argument: 2

const std::vector<Spec>& Specs() {
  static const std::vector<Spec> rp_specs = {
      {"rp/big", DType::kFloat32, {1001, 33}, 6},  // replicated: split among all ranks
      {"rp/pairs", DType::kFloat32, {100, 6}, 7},  // rows in halves, each held by two ranks
      {"rp/small", DType::kFloat32, {3}, 8},       // replicated, under the threshold
  };
  static const std::vector<Spec> specs = {
      {"uneven/rows", DType::kFloat32, {1001, 7}, 1},  // rows split unevenly
      {"block/2d", DType::kInt32, {64, 45}, 2},        // 2-D block grid
      {"opt/bf16", DType::kBFloat16, {333}, 3},       {"replicated/bias", DType::kFloat64, {17}, 4},
      {"replicated/step", DType::kInt64, {}, 5},
  };
  if (replica_parallel) {
    static const std::vector<Spec> all = [] {
      std::vector<Spec> v = specs;
      v.insert(v.end(), rp_specs.begin(), rp_specs.end());
      return v;
    }();
    return all;
  }
  return specs;
}

// A 2-D process grid for p ranks: 4 -> 2x2, otherwise p x 1 or 1 x p.
std::pair<int, int> Grid(int p, bool transpose) {
  std::pair<int, int> g = p == 4 ? std::pair{2, 2} : std::pair{p, 1};
  return transpose ? std::pair{g.second, g.first} : g;
}

// The boxes rank r of p holds (save) or wants (restore, `other` = true: a
// different layout from the save's).
std::vector<Box> BoxesOf(const Spec& s, int p, int r, bool other) {
  std::string n = s.name;
  if (n == "rp/pairs" && !other) {  // ranks 2k and 2k+1 hold shard k
    auto [b, e] = SplitRange(s.shape[0], (p + 1) / 2, r / 2);
    Box box = FullBox(s.shape);
    box.start[0] = b;
    box.count[0] = e - b;
    return {box};
  }
  if (n == "uneven/rows" || n == "opt/bf16" || (n == "rp/big" && other) || n == "rp/pairs") {
    int part = other ? p - 1 - r : r;
    auto [b, e] = SplitRange(s.shape[0], p, part);
    Box box = FullBox(s.shape);
    box.start[0] = b;
    box.count[0] = e - b;
    return {box};
  }
  if (n == "block/2d") {
    auto [gx, gy] = Grid(p, other);
    auto [x0, x1] = SplitRange(s.shape[0], gx, r / gy);
    auto [y0, y1] = SplitRange(s.shape[1], gy, r % gy);
    return {Box{{x0, y0}, {x1 - x0, y1 - y0}}};
  }
  return {FullBox(s.shape)};  // replicated
}

int Save(const std::string& dir, int p, int r) {
  if (r == 0) std::filesystem::remove_all(dir);  // a fresh checkpoint every run
  MPI_Barrier(MPI_COMM_WORLD);
  Options o;
  if (replica_parallel) o.replica_parallel_min_bytes = 64;  // rp/small (12 bytes) stays whole
  o.format_version = format_version;
  o.files.ranks_per_file = ranks_per_file;
  auto mgr = OpenAgreed(dir, o);
  if (!mgr.ok()) return fmt::print(stderr, "open: {}\n", mgr.status().ToString()), 1;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToSave> arrays;
  for (const Spec& s : Specs()) {
    ArrayToSave a{s.name, s.dtype, s.shape, {}};
    for (const Box& b : BoxesOf(s, p, r, false)) {
      bufs.push_back(Fill(s.dtype, s.shape, b, s.seed));
      a.shards.push_back(Shard{b, bufs.back().data()});
    }
    arrays.push_back(std::move(a));
  }
  Status st = (*mgr)->Save(42, arrays);
  for (auto& b : bufs) std::memset(b.data(), 0, b.size());  // Save has copied them
  if (st.ok()) st = (*mgr)->WaitUntilFinished();
  if (!st.ok()) return fmt::print(stderr, "rank {}: save: {}\n", r, st.ToString()), 1;
  if (r == 0) fmt::print("saved step 42 at {} ranks in {}\n", p, dir);
  return 0;
}

int Restore(const std::string& dir, int p, int r) {
  auto mgr = OpenAgreed(dir);
  if (!mgr.ok()) return fmt::print(stderr, "open: {}\n", mgr.status().ToString()), 1;
  auto latest = (*mgr)->LatestStep();
  if (!latest.ok() || !latest.value() || **latest != 42) {
    return fmt::print(stderr, "rank {}: no step 42 in {}\n", r, dir), 1;
  }
  auto described = (*mgr)->Describe(42);
  if (!described.ok() || described->format_version != format_version) {
    return fmt::print(stderr, "rank {}: step 42 is not in format {}\n", r, format_version), 1;
  }
  if (ranks_per_file > 0) {  // one subfile per two ranks of the save, data.h5 besides
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir, 42));
    const int want = m.ok() ? (m->world_size + ranks_per_file - 1) / ranks_per_file : -1;
    if (!m.ok() || m->files != want ||
        !std::filesystem::exists(io::SubfilePath(dir, 42, want - 1)) ||
        std::filesystem::exists(io::SubfilePath(dir, 42, want))) {
      return fmt::print(stderr, "rank {}: step 42 is not in {} subfiles\n", r, want), 1;
    }
  }
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToRestore> arrays;
  for (const Spec& s : Specs()) {
    ArrayToRestore a{s.name, s.dtype, {}};
    for (const Box& b : BoxesOf(s, p, r, true)) {
      bufs.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(s.dtype),
                        std::byte{0x5A});
      a.shards.push_back(Destination{b, bufs.back().data()});
    }
    arrays.push_back(std::move(a));
  }
  Status st = (*mgr)->Restore(42, arrays, RestoreOptions{.strict = true});
  if (!st.ok()) return fmt::print(stderr, "rank {}: restore: {}\n", r, st.ToString()), 1;
  int bad = 0;
  size_t k = 0;
  uint64_t bytes = 0;
  for (const Spec& s : Specs()) {
    for (const Box& b : BoxesOf(s, p, r, true)) {
      if (Fill(s.dtype, s.shape, b, s.seed) != bufs[k]) {
        fmt::print(stderr, "rank {}: array '{}' box {} differs\n", r, s.name, BoxToString(b));
        ++bad;
      }
      bytes += bufs[k++].size();
    }
  }
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  uint64_t all_bytes = testing::SumOverRanks(bytes);
  if (r == 0) {
    auto marker_ws = std::filesystem::path(dir).filename().string();
    fmt::print("N-to-M: saved {} -> restored at M={}: {} bytes compared, {} boxes differ: {}\n",
               marker_ws, p, all_bytes, all_bad, all_bad ? "FAIL" : "ok");
  }
  return all_bad ? 1 : 0;
}

// Rank 0: a copy of the checkpoint in `dir` with one byte of block/2d's
// element (40, 30) flipped, at the offset its marker records. Its path.
Result<std::string> DamagedCopy(const std::string& dir, int p) {
  const std::string copy = fmt::format("{}_damaged_at_{}", dir, p);
  std::filesystem::remove_all(copy);
  std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, io::ReadMarker(io::MarkerPath(copy, 42)));
  int64_t at = m.Find("block/2d")->offset + (40 * 45 + 30) * 4 + 1;
  std::string path = io::DataPath(copy, 42);
  if (m.files > 0) {  // the byte's box, at its place in its subfile (from the index)
    MHCKPT_RETURN_IF_ERROR(io::LoadIndex(io::IndexPath(copy, 42), &m));
    for (const io::MarkerBox& b : m.Find("block/2d")->boxes) {
      const int64_t row = 40 - b.box.start[0], col = 30 - b.box.start[1];
      if (row < 0 || row >= b.box.count[0] || col < 0 || col >= b.box.count[1]) continue;
      at = b.file_offset + (row * b.box.count[1] + col) * 4 + 1;
      path = io::SubfilePath(copy, 42, b.file);
    }
  }
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(at);
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x20));
  if (!f) return IoError("cannot flip a byte of " + io::DataPath(copy, 42));
  return copy;
}

// Restores the damaged copy with the other layout: every rank must get the
// same DataLoss naming block/2d and the chunk (parts of stored boxes read at
// another world size must come back checked).
int RestoreDamaged(const std::string& dir, int p, int r) {
  std::string copy = fmt::format("{}_damaged_at_{}", dir, p);
  Status made;
  if (r == 0) {
    Result<std::string> c = DamagedCopy(dir, p);
    made = c.status();
  }
  int failed = made.ok() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) return fmt::print(stderr, "rank {}: {}\n", r, made.ToString()), 1;
  auto mgr = OpenAgreed(copy);
  if (!mgr.ok()) return fmt::print(stderr, "open: {}\n", mgr.status().ToString()), 1;
  const Spec* block = nullptr;
  for (const Spec& s : Specs()) {
    if (std::string(s.name) == "block/2d") block = &s;
  }
  std::vector<std::vector<std::byte>> bufs;
  ArrayToRestore a{block->name, block->dtype, {}};
  for (const Box& b : BoxesOf(*block, p, r, true)) {
    bufs.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(block->dtype));
    a.shards.push_back(Destination{b, bufs.back().data()});
  }
  Status st = (*mgr)->Restore(42, std::vector<ArrayToRestore>{a});
  const bool named = st.code() == StatusCode::kDataLoss &&
                     st.message().find("array 'block/2d' box") != std::string::npos &&
                     st.message().find("checksum mismatch") != std::string::npos;
  const bool same = testing::SameOnAllRanks(st);
  if (r == 0) {
    fmt::print("N-to-M, one byte flipped, restored at M={}: {}: {}\n", p, st.ToString(),
               named && same ? "ok" : "FAIL");
  }
  return named && same ? 0 : 1;
}

// With subfiles: restores every array from a copy without its last subfile.
// Every rank must get the same DataLoss, naming the lost file.
int RestoreLost(const std::string& dir, int p, int r) {
  const std::string copy = fmt::format("{}_lost_at_{}", dir, p);
  int files = 0;
  if (r == 0) {
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(copy, 42));
    files = m.ok() ? m->files : 0;
    if (files > 0) std::filesystem::remove(io::SubfilePath(copy, 42, files - 1));
  }
  MPI_Bcast(&files, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (files == 0) return fmt::print(stderr, "rank {}: {} has no subfiles\n", r, dir), 1;
  auto mgr = OpenAgreed(copy);
  if (!mgr.ok()) return fmt::print(stderr, "open: {}\n", mgr.status().ToString()), 1;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ArrayToRestore> arrays;
  for (const Spec& s : Specs()) {
    ArrayToRestore a{s.name, s.dtype, {}};
    for (const Box& b : BoxesOf(s, p, r, true)) {
      bufs.emplace_back(static_cast<size_t>(*Volume(b.count)) * DTypeSize(s.dtype));
      a.shards.push_back(Destination{b, bufs.back().data()});
    }
    arrays.push_back(std::move(a));
  }
  Status st = (*mgr)->Restore(42, arrays);
  const bool named = st.code() == StatusCode::kDataLoss &&
                     st.message().find(io::SubfileName(files - 1)) != std::string::npos &&
                     st.message().find("box") != std::string::npos;
  const bool same = testing::SameOnAllRanks(st);
  if (r == 0) {
    fmt::print("subfile {} lost, restored at M={}: {}: {}\n", io::SubfileName(files - 1), p,
               st.ToString(), named && same ? "ok" : "FAIL");
  }
  return named && same ? 0 : 1;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) {
  return mhckpt::testing::RunJob(argc, argv, [](int argc, char** argv, int p, int r) {
    int rc = 2;
    if (argc == 4 && std::strcmp(argv[3], "rp") == 0) {
      mhckpt::replica_parallel = true;
      --argc;
    } else if (argc == 4 && std::strcmp(argv[3], "f2") == 0) {
      mhckpt::format_version = 2;
      --argc;
    } else if (argc == 4 && std::strcmp(argv[3], "sub2") == 0) {
      mhckpt::ranks_per_file = 2;
      --argc;
    }
    if (argc == 3 && std::strcmp(argv[1], "save") == 0)
      rc = mhckpt::Save(argv[2], p, r);
    else if (argc == 3 && std::strcmp(argv[1], "restore") == 0)
      rc = mhckpt::Restore(argv[2], p, r);
    else if (argc == 3 && std::strcmp(argv[1], "damaged") == 0)
      rc = mhckpt::RestoreDamaged(argv[2], p, r);
    else if (argc == 3 && std::strcmp(argv[1], "lost") == 0)
      rc = mhckpt::RestoreLost(argv[2], p, r);
    else if (r == 0)
      std::fprintf(stderr, "usage: reshard_test save|restore|damaged|lost DIR [rp|f2|sub2]\n");
    return rc;
  });
}
