#include "tests/test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>

#include "io/layout.h"
#include "io/marker.h"
#include "io/posix_file.h"

namespace mhckpt::testing {

int Rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int Size(MPI_Comm comm) {
  int s = 1;
  MPI_Comm_size(comm, &s);
  return s;
}

namespace {
// Removes the directories FreshDir made for a test once it has ended without
// a failure on any rank, so that a full run does not leave gigabytes behind
// (the suite's checkpoints add up to several GiB). A failed test keeps its
// data to look at; MHCKPT_KEEP_TEST_DATA=1 keeps every test's. Registered by
// the first FreshDir, which every rank calls together, so every rank takes
// part in the agreement at the end of every later test.
class FreshDirCleaner : public ::testing::EmptyTestEventListener {
 public:
  void Add(std::string dir) { dirs_.push_back(std::move(dir)); }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any == 0 && Rank() == 0) {
      std::error_code ignored;
      for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ignored);
    }
    dirs_.clear();
  }

 private:
  std::vector<std::string> dirs_;
};

FreshDirCleaner* Cleaner() {
  static FreshDirCleaner* cleaner = [] {
    auto* c = new FreshDirCleaner;  // owned by GoogleTest's listener list
    ::testing::UnitTest::GetInstance()->listeners().Append(c);
    return c;
  }();
  return cleaner;
}

bool KeepTestData() {
  const char* keep = std::getenv("MHCKPT_KEEP_TEST_DATA");
  return keep != nullptr && std::string(keep) == "1";
}
}  // namespace

std::string FreshDir(const std::string& suffix) {
  const char* base = std::getenv("MHCKPT_TEST_DIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string(base ? base : "/tmp/mhckpt-test") + "/np" + std::to_string(Size()) +
                    "/" + info->test_suite_name() + "." + info->name() + suffix;
  if (Rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  if (!KeepTestData()) Cleaner()->Add(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

namespace {
uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<std::byte> Fill(DType dtype, const std::vector<int64_t>& shape, const Box& box,
                            uint64_t seed) {
  const size_t es = DTypeSize(dtype);
  const int64_t n = Volume(box.count).value();
  std::vector<std::byte> out(static_cast<size_t>(n) * es);
  const size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);  // position inside the box
  for (int64_t e = 0; e < n; ++e) {
    int64_t global = 0;
    for (size_t d = 0; d < rank; ++d) global = global * shape[d] + box.start[d] + idx[d];
    uint64_t h = Mix(seed * 1000003ULL + static_cast<uint64_t>(global));
    for (size_t k = 0; k < es; ++k)
      out[static_cast<size_t>(e) * es + k] = static_cast<std::byte>(h >> (8 * k));
    if (dtype == DType::kBool) out[static_cast<size_t>(e)] = static_cast<std::byte>(h & 1);
    for (size_t d = rank; d-- > 0;) {  // advance the row-major counter
      if (++idx[d] < box.count[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Result<std::unique_ptr<CheckpointManager>> OpenAgreed(const std::string& dir,
                                                      const Options& options, MPI_Comm comm) {
  auto opened = CheckpointManager::Open(comm, dir, options);
  int ok = opened.ok() ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, comm);
  if (all) return opened;
  if (!opened.ok()) return opened.status();
  return Internal("CheckpointManager::Open of '" + dir + "' failed on another rank");
}

std::unique_ptr<CheckpointManager> OpenForTest(const std::string& dir, const Options& options) {
  auto opened = OpenAgreed(dir, options);
  if (!opened.ok()) {
    ADD_FAILURE() << "rank " << Rank() << ": " << opened.status().ToString();
    return nullptr;
  }
  return std::move(opened).value();
}

bool ForgetOffsets(const std::string& dir, int64_t step) {
  uint64_t failed = 0;
  if (Rank() == 0) {
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(dir, step));
    if (m.ok()) {
      for (io::MarkerArray& a : m->arrays) a.offset = -1;
      failed = io::WriteFileAtomic(io::MarkerPath(dir, step), io::MarkerToJson(*m)).ok() ? 0 : 1;
    } else {
      failed = 1;
    }
  }
  return SumOverRanks(failed) == 0;
}

bool SameOnAllRanks(const Status& s, MPI_Comm comm) {
  std::string mine = s.Serialize();
  std::string root = mine;
  unsigned long long n = root.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm);
  root.resize(n);
  MPI_Bcast(root.data(), static_cast<int>(n), MPI_BYTE, 0, comm);
  int same = root == mine ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, comm);
  return all != 0;
}

uint64_t SumOverRanks(uint64_t v, MPI_Comm comm) {
  unsigned long long in = v, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  return out;
}

int RunJob(int argc, char** argv,
           const std::function<int(int argc, char** argv, int size, int rank)>& body) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const int rc = body(argc, argv, Size(), Rank());
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}

}  // namespace mhckpt::testing
