// Comm::Serial(): one process, world size 1, no MPI call (this binary never
// initialises MPI). Each collective gives its one-rank result, and protocol
// code written against Comm runs on it as a plain unit test: the collective
// HDF5 hold (io/h5_lock.h) and a whole save of the direct engine, one data
// file and subfiles (io/direct_writer.h, io/subfile_writer.h), laid out and
// then replayed (io/dataset_layout.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/comm.h"
#include "io/direct_engine.h"
#include "io/h5_lock.h"
#include "io/layout.h"

namespace mhckpt {
namespace {

using internal::Comm;

TEST(SerialComm, IsOneRankWithTheOneRankResultOfEachCollective) {
  const Comm comm = Comm::Serial();
  EXPECT_TRUE(comm.serial());
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.get(), MPI_COMM_NULL);

  EXPECT_EQ(comm.GatherBytes("abc", 0), std::vector<std::string>{"abc"});
  EXPECT_EQ(comm.GatherBytes("", 0, 1), std::vector<std::string>{""});
  EXPECT_EQ(comm.AllGatherBytes("xyz"), std::vector<std::string>{"xyz"});
  std::string bytes = "kept";
  comm.BroadcastBytes(&bytes, 0);
  EXPECT_EQ(bytes, "kept");
  std::vector<int64_t> values{3, -1, 7};
  comm.BroadcastValues(&values, 0);
  EXPECT_EQ(values, (std::vector<int64_t>{3, -1, 7}));
  comm.AllreduceMax(&values);
  EXPECT_EQ(values, (std::vector<int64_t>{3, -1, 7}));
  std::vector<int> ints{4, 2};
  comm.AllreduceMax(&ints);
  EXPECT_EQ(ints, (std::vector<int>{4, 2}));
  EXPECT_EQ(comm.AllreduceMax(5), 5);
  EXPECT_EQ(comm.AllreduceSum(6), 6);
  EXPECT_TRUE(comm.AllreduceAnd(true));
  EXPECT_FALSE(comm.AllreduceAnd(false));
  EXPECT_EQ(comm.ScatterInt({9}, 0), 9);
  EXPECT_EQ(comm.SharedMemoryLeader(), 0);
  EXPECT_EQ(comm.AllToAllValues({{1, 2, 3}}), (std::vector<std::vector<int64_t>>{{1, 2, 3}}));
  comm.Barrier();

  const Comm part = comm.Split(3);
  EXPECT_TRUE(part.serial());
  EXPECT_EQ(part.size(), 1);
  EXPECT_NE(part.id(), comm.id());
  EXPECT_NE(Comm::Serial().id(), comm.id());
}

TEST(SerialComm, MovesKeepTheIdentity) {
  Comm a = Comm::Serial();
  const uint64_t id = a.id();
  Comm b = std::move(a);
  EXPECT_EQ(b.id(), id);
  EXPECT_TRUE(b.serial());
}

// Messages to self meet whichever side is posted first, tag by tag, in order.
TEST(SerialComm, MessagesToSelfMeetByTag) {
  const Comm comm = Comm::Serial();
  std::vector<MPI_Request> requests;
  const std::string first = "first", second = "second", other = "other";
  std::string got_first(first.size(), '\0'), got_second(second.size(), '\0');
  std::string got_other(other.size(), '\0');
  comm.PostSend(first.data(), first.size(), 0, 1, &requests);
  comm.PostReceive(got_other.data(), got_other.size(), 0, 2, &requests);
  comm.PostSend(second.data(), second.size(), 0, 1, &requests);
  comm.PostReceive(got_first.data(), got_first.size(), 0, 1, &requests);
  comm.PostReceive(got_second.data(), got_second.size(), 0, 1, &requests);
  comm.PostSend(other.data(), other.size(), 0, 2, &requests);
  Comm::WaitAll(&requests);
  EXPECT_TRUE(requests.empty());
  EXPECT_EQ(got_first, first);
  EXPECT_EQ(got_second, second);
  EXPECT_EQ(got_other, other);
}

// The collective HDF5 hold's protocol (barrier, try-lock, and-reduce) on one rank.
TEST(SerialComm, CollectiveHdf5HoldIsTakenAndLetGo) {
  const Comm comm = Comm::Serial();
  EXPECT_FALSE(io::H5LockHeldByThisThread());
  {
    io::H5CollectiveHold hold = io::H5CollectiveHold::Acquire(comm);
    EXPECT_TRUE(io::H5LockHeldByThisThread());
    io::H5CollectiveHold nested = io::H5CollectiveHold::Acquire(comm);
    nested.Release();
    EXPECT_TRUE(io::H5LockHeldByThisThread());
  }
  EXPECT_FALSE(io::H5LockHeldByThisThread());
}

std::string TempRoot(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("mhckpt-comm-serial-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Two arrays: "a" (4 x 3 float32, two boxes of two rows) and "b" (5 int64,
// one box), all written by rank 0.
std::vector<io::ArraySpec> Arrays() {
  io::ArraySpec a{"a", DType::kFloat32, {4, 3}, -1, 0, {}};
  a.boxes = {{{{0, 0}, {2, 3}}, 0}, {{{2, 0}, {2, 3}}, 0}};
  io::ArraySpec b{"b", DType::kInt64, {5}, -1, 0, {}};
  b.boxes = {{{{0}, {5}}, 0}};
  return {a, b};
}

// Saves Arrays() as `step` through the engine on a serial Comm and checks
// each box's bytes where the writer says they lie.
void SaveAndCheck(io::Engine& engine, const Comm& comm, const std::string& root, int64_t step) {
  std::filesystem::create_directories(io::StepDir(root, step));
  const std::vector<io::ArraySpec> arrays = Arrays();
  std::vector<float> a(12);
  std::iota(a.begin(), a.end(), 1.5F + static_cast<float>(step));
  std::vector<int64_t> b(5);
  std::iota(b.begin(), b.end(), int64_t{100} * step);

  auto created = engine.Create(root, step, comm);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  io::StepWriter& writer = **created;
  ASSERT_TRUE(writer.CreateArrays(arrays).ok());
  ASSERT_TRUE(writer.Reserve().ok());
  ASSERT_TRUE(writer.Write(0, arrays[0].boxes[0].box, a.data()).ok());
  ASSERT_TRUE(writer.Write(0, arrays[0].boxes[1].box, a.data() + 6).ok());
  ASSERT_TRUE(writer.Write(1, arrays[1].boxes[0].box, b.data()).ok());
  ASSERT_TRUE(writer.FinishWrites().ok());
  ASSERT_TRUE(writer.Flush().ok());

  const auto bytes_of = [](const auto& v, size_t from, size_t n) {
    return std::string(reinterpret_cast<const char*>(v.data() + from), n * sizeof(v[0]));
  };
  if (writer.Files() == 0) {  // one data file: each array at its offset
    const std::string file = ReadFile(io::DataPath(root, step));
    ASSERT_GE(writer.FileOffset(0), 0);
    ASSERT_GE(writer.FileOffset(1), 0);
    EXPECT_EQ(file.substr(static_cast<size_t>(writer.FileOffset(0)), 48), bytes_of(a, 0, 12));
    EXPECT_EQ(file.substr(static_cast<size_t>(writer.FileOffset(1)), 40), bytes_of(b, 0, 5));
    return;
  }
  EXPECT_EQ(writer.Files(), 1);  // one rank: one group
  EXPECT_EQ(writer.FileOffset(0), -1);
  EXPECT_TRUE(std::filesystem::exists(io::DataPath(root, step)));  // the virtual datasets
  const std::string file = ReadFile(io::SubfilePath(root, step, 0));
  const auto place = [&](size_t array, size_t box) {
    const std::optional<io::BoxPlace> p = writer.Place(array, box);
    EXPECT_TRUE(p.has_value());
    EXPECT_EQ(p->file, 0u);
    return static_cast<size_t>(p->offset);
  };
  EXPECT_EQ(file.substr(place(0, 0), 24), bytes_of(a, 0, 6));
  EXPECT_EQ(file.substr(place(0, 1), 24), bytes_of(a, 6, 6));
  EXPECT_EQ(file.substr(place(1, 0), 40), bytes_of(b, 0, 5));
}

class SerialSave : public ::testing::TestWithParam<int> {};

// A save, then the same arrays again: laid out through HDF5, then replayed
// (where replay runs), every box where the writer says, with no MPI at all.
TEST_P(SerialSave, LaysOutThenReplays) {
  const int ranks_per_file = GetParam();
  const Comm comm = Comm::Serial();
  const std::string root = TempRoot("save" + std::to_string(ranks_per_file + 1));
  std::unique_ptr<io::Engine> engine = io::MakeDirectEngine(2, false, ranks_per_file);
  SaveAndCheck(*engine, comm, root, 1);
  const uint64_t replays = io::LayoutReplays();
  SaveAndCheck(*engine, comm, root, 2);
  const bool subfiles = ranks_per_file != 0;
  EXPECT_EQ(io::LayoutReplays() - replays,
            io::LayoutReplayEnabled() ? (subfiles ? 2u : 1u) : 0u);  // with subfiles, data.h5 too
  std::filesystem::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(OneFileAndSubfiles, SerialSave, ::testing::Values(0, 1, io::kFilePerNode),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0   ? std::string("OneFile")
                                  : info.param == 1 ? std::string("SubfilePerRank")
                                                    : std::string("SubfilePerNode");
                         });

}  // namespace
}  // namespace mhckpt
