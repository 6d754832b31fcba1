// Two CheckpointManagers in one process, each with its own communicator
// (a duplicate of the world, and a split of it, in the same or in reverse
// rank order) and its own root, save and restore at
// the same time from two threads. Their I/O threads then call HDF5
// concurrently, which Debian's HDF5 (not thread-safe) survives only because
// every HDF5 call sequence of a process is serialised (io/h5_lock.h); the
// HDF5 data path's collective calls must not deadlock on that lock either.
// Every step changes the arrays (names and shapes), so every save lays out
// through HDF5 again. scripts/test.sh runs this test under ThreadSanitizer.
#include <gtest/gtest.h>

#include <mpi.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "io/h5_lock.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::ForgetOffsets;
using testing::FreshDir;
using testing::OpenAgreed;
using testing::Rank;

constexpr int kSteps = 4;
constexpr int kArrays = 6;  // at step 0; one more at each step

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The arrays of `step` of manager `which`: names and shapes change with
// the step, so no two steps have the same layout.
std::vector<Spec> Arrays(int which, int step) {
  std::vector<Spec> specs;
  for (int i = 0; i < kArrays + step; ++i) {
    specs.push_back({fmt::format("m{}/s{}/a{}", which, step, i),
                     i % 2 == 0 ? DType::kFloat32 : DType::kInt16,
                     {17 * (step + 1) + 5 * i, 3 + i}});
  }
  specs.push_back({fmt::format("m{}/counter", which), DType::kInt64, {}});
  return specs;
}

// Rows split over the communicator's ranks (a scalar: rank 0 only).
Box BoxOf(const Spec& s, int ranks, int rank) {
  Box box = FullBox(s.shape);
  if (s.shape.empty()) return box;
  auto [lo, hi] = SplitRange(s.shape[0], ranks, rank);
  box.start[0] = lo;
  box.count[0] = hi - lo;
  return box;
}

uint64_t Seed(int which, int step, size_t i) { return 100000 * which + 1000 * step + i; }

// One manager's life on one thread; failures are collected as text, since
// GoogleTest assertions stop only the thread they run on.
class Worker {
 public:
  Worker(int which, MPI_Comm comm, Options options) : which_(which), comm_(comm) {
    MPI_Comm_size(comm, &ranks_);
    MPI_Comm_rank(comm, &rank_);
    dir_ = FreshDir(fmt::format("m{}", which));
    auto opened = OpenAgreed(dir_, options, comm);
    if (!opened.ok()) {
      Fail(opened.status().ToString());
      return;
    }
    mgr_ = std::move(opened).value();
  }

  void SaveAll() {
    for (int step = 0; step < kSteps && mgr_; ++step) {
      std::vector<std::vector<std::byte>> buffers;
      std::vector<ArrayToSave> arrays;
      for (const Spec& s : Arrays(which_, step)) {
        const bool scalar = s.shape.empty();
        const Box box = BoxOf(s, ranks_, rank_);
        arrays.push_back({s.name, s.dtype, s.shape, {}});
        if (scalar && rank_ != 0) continue;
        buffers.push_back(Fill(s.dtype, s.shape, box, Seed(which_, step, arrays.size())));
        arrays.back().shards.push_back(Shard{box, buffers.back().data()});
      }
      Status s = mgr_->Save(step, arrays);
      if (s.ok()) s = mgr_->WaitUntilFinished();
      if (!s.ok()) Fail(fmt::format("save step {}: {}", step, s.ToString()));
    }
  }

  void RestoreAll() {
    for (int step = 0; step < kSteps && mgr_; ++step) {
      std::vector<Spec> specs = Arrays(which_, step);
      std::vector<std::vector<std::byte>> got(specs.size());
      std::vector<ArrayToRestore> want;
      for (size_t i = 0; i < specs.size(); ++i) {
        // Another sharding than at save: the rows in reverse rank order.
        const Box box = BoxOf(specs[i], ranks_, ranks_ - 1 - rank_);
        got[i].resize(Fill(specs[i].dtype, specs[i].shape, box, 0).size());
        want.push_back({specs[i].name, specs[i].dtype, {{box, got[i].data()}}});
      }
      Status s = mgr_->Restore(step, want);
      if (!s.ok()) Fail(fmt::format("restore step {}: {}", step, s.ToString()));
      for (size_t i = 0; s.ok() && i < specs.size(); ++i) {
        const Box box = BoxOf(specs[i], ranks_, ranks_ - 1 - rank_);
        if (got[i] != Fill(specs[i].dtype, specs[i].shape, box, Seed(which_, step, i + 1))) {
          Fail(fmt::format("step {}: array '{}' restored other bytes", step, specs[i].name));
        }
      }
    }
  }

  void Close() { mgr_.reset(); }
  [[nodiscard]] bool open() const { return mgr_ != nullptr; }
  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] const std::vector<std::string>& failures() const { return failures_; }

 private:
  void Fail(std::string what) {
    failures_.push_back(fmt::format("manager {} rank {}: {}", which_, rank_, what));
  }

  int which_;
  MPI_Comm comm_;
  int ranks_ = 1, rank_ = 0;
  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
  std::vector<std::string> failures_;
};

struct Paths {
  DataPath a, b;
  bool reverse_b;  // b's ranks in reverse order: its rank 0 is the last process
};

class TwoManagers : public ::testing::TestWithParam<Paths> {};

TEST_P(TwoManagers, SaveAndRestoreConcurrentlyFromTwoThreads) {
  MPI_Comm a = MPI_COMM_NULL, b = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_split(MPI_COMM_WORLD, 0, GetParam().reverse_b ? -Rank() : Rank(), &b);
  Options oa, ob;
  oa.data_path = GetParam().a;
  ob.data_path = GetParam().b;
  {
    Worker wa(0, a, oa), wb(1, b, ob);
    ASSERT_TRUE(wa.open() && wb.open());
    std::thread ta([&] { wa.SaveAll(); });
    std::thread tb([&] { wb.SaveAll(); });
    ta.join();
    tb.join();
    // Manager b's restores read through HDF5 (collective opens) for every
    // step, while manager a's read by offset (or through HDF5 too, with
    // the HDF5 data path, which records no offsets).
    for (int step = 0; step < kSteps; ++step) ASSERT_TRUE(ForgetOffsets(wb.dir(), step));
    std::thread ra([&] { wa.RestoreAll(); });
    std::thread rb([&] { wb.RestoreAll(); });
    ra.join();
    rb.join();
    for (const std::string& f : wa.failures()) ADD_FAILURE() << f;
    for (const std::string& f : wb.failures()) ADD_FAILURE() << f;
    wa.Close();
    wb.Close();
  }
  EXPECT_FALSE(io::H5LockHeldByThisThread());
  MPI_Comm_free(&a);
  MPI_Comm_free(&b);
}

std::string PathsName(const ::testing::TestParamInfo<Paths>& info) {
  auto name = [](DataPath p) {
    return p == DataPath::kDirect ? "Direct" : p == DataPath::kBuffered ? "Buffered" : "Hdf5";
  };
  return std::string(name(info.param.a)) + "_" + name(info.param.b);
}

INSTANTIATE_TEST_SUITE_P(DataPaths, TwoManagers,
                         ::testing::Values(
                             // Both rank 0s in one process: their layouts at once.
                             Paths{DataPath::kDirect, DataPath::kDirect, false},
                             // Collective HDF5 calls on communicators of other orders.
                             Paths{DataPath::kDirect, DataPath::kHdf5, true},
                             Paths{DataPath::kHdf5, DataPath::kHdf5, true}),
                         PathsName);

}  // namespace
}  // namespace mhckpt
