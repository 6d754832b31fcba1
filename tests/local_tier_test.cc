// The local tier (Options::local_dir): saves committed in node-local
// directories with copies on other nodes, the shared root every
// persistent_every-th save, and recovery after a node's local dir is gone.
// Nodes are simulated on one machine: Options::node_id puts ranks on nodes
// (2 ranks per node at 4 ranks, 1 otherwise) and each node gets its own
// local dir, DIR/node<N>. A "lost node" is a node whose dir was removed (a
// replacement node starts with an empty one).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "base/fault.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

int RanksPerNode(int size) { return size == 4 ? 2 : 1; }
int NodeOf(int rank, int size) { return rank / RanksPerNode(size); }
int NodeCount(int size) { return (size + RanksPerNode(size) - 1) / RanksPerNode(size); }

Options TwoTierOptions(const std::string& dir, int rank, int size) {
  Options o;
  o.local_dir = dir + "/node" + std::to_string(NodeOf(rank, size));
  o.node_id = NodeOf(rank, size);
  o.persistent_every = 2;
  return o;
}

const std::vector<int64_t> kShape{37, 5};

// Rows of kShape for `part` of `parts`.
Box Rows(int parts, int part) {
  auto [b, e] = SplitRange(kShape[0], parts, part);
  return Box{{b, 0}, {e - b, kShape[1]}};
}

// What each rank saves at `step`: its rows of "w" and all of "r".
struct Step {
  std::vector<std::byte> w, r;
  std::vector<ArrayToSave> arrays;
  Step(int64_t step, int rank, int size) {
    const auto seed = static_cast<uint64_t>(step);
    w = Fill(DType::kFloat32, kShape, Rows(size, rank), seed);
    r = Fill(DType::kInt64, {11}, FullBox({11}), seed + 100);
    arrays.push_back({"w", DType::kFloat32, kShape, {Shard{Rows(size, rank), w.data()}}});
    arrays.push_back({"r", DType::kInt64, {11}, {Shard{FullBox({11}), r.data()}}});
  }
};

// Restores `step` with this rank's rows out of `parts` (of "w") and all of "r", and
// checks every byte.
Status RestoreAndCheck(CheckpointManager& m, int64_t step, int parts, int part,
                       RestoreSource source = RestoreSource::kAny) {
  const Box rows = Rows(parts, part);
  std::vector<std::byte> w(BoxBytes(rows, DType::kFloat32)), r(11 * 8);
  std::vector<ArrayToRestore> want{{"w", DType::kFloat32, {Destination{rows, w.data()}}},
                                   {"r", DType::kInt64, {Destination{FullBox({11}), r.data()}}}};
  RestoreOptions ro;
  ro.source = source;
  Status s = m.Restore(step, want, ro);
  if (s.ok()) {
    const auto seed = static_cast<uint64_t>(step);
    EXPECT_TRUE(w == Fill(DType::kFloat32, kShape, rows, seed)) << "step " << step;
    EXPECT_TRUE(r == Fill(DType::kInt64, {11}, FullBox({11}), seed + 100)) << "step " << step;
  }
  return s;
}

std::unique_ptr<CheckpointManager> OpenTwoTier(const std::string& dir,
                                               MPI_Comm comm = MPI_COMM_WORLD, int world = Size()) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  auto m = CheckpointManager::Open(comm, dir + "/shared", TwoTierOptions(dir, rank, world));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Every step 0..4: the shared root gets 0, 2, 4; the local tier keeps 3, 4.
TEST(TwoTiers, SavesGoWherePersistentEverySays) {
  const std::string dir = FreshDir();
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  for (int64_t step = 0; step < 5; ++step) {
    Step s(step, Rank(), Size());
    ASSERT_TRUE(m->Save(step, s.arrays).ok());
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_EQ(m->LastSaveTimings().persistent, step % 2 == 0);
  }
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  std::vector<std::tuple<int64_t, bool, bool>> got;
  for (const auto& t : *steps) got.emplace_back(t.step, t.persistent, t.local);
  const std::vector<std::tuple<int64_t, bool, bool>> want{
      {0, true, false}, {2, true, false}, {3, false, true}, {4, true, true}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(m->LatestStep()->value_or(-1), 4);
  EXPECT_TRUE(RestoreAndCheck(*m, 3, Size(), Rank()).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 4, Size(), Rank(), RestoreSource::kLocal).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 4, Size(), Rank(), RestoreSource::kPersistent).ok());
  // Restored with another sharding: every rank all of "w".
  EXPECT_TRUE(RestoreAndCheck(*m, 3, 1, 0).ok());
  Status gone = RestoreAndCheck(*m, 1, Size(), Rank());
  EXPECT_EQ(gone.code(), StatusCode::kNotFound) << gone.ToString();
  Status not_local = RestoreAndCheck(*m, 2, Size(), Rank(), RestoreSource::kLocal);
  EXPECT_EQ(not_local.code(), StatusCode::kNotFound) << not_local.ToString();
  auto d = m->Describe(3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->world_size, Size());
  // A step committed in either tier is refused.
  Step again(3, Rank(), Size());
  ASSERT_TRUE(m->Save(3, again.arrays).ok());
  Status refused = m->WaitUntilFinished();
  EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists) << refused.ToString();
  EXPECT_TRUE(SameOnAllRanks(refused));
}

// A per-save override: a local-only save and a persistent one.
TEST(TwoTiers, SaveOptionsChooseTheTier) {
  const std::string dir = FreshDir();
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays, {}, SaveOptions{.tier = SaveTier::kLocal}).ok());
  ASSERT_TRUE(m->Save(1, s1.arrays, {}, SaveOptions{.tier = SaveTier::kPersistent}).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 2U);
  EXPECT_TRUE((*steps)[0].local && !(*steps)[0].persistent);
  EXPECT_TRUE((*steps)[1].local && (*steps)[1].persistent);
  // Ranks that disagree on the tier: an agreed error, nothing committed.
  Step s2(2, Rank(), Size());
  ASSERT_TRUE(m->Save(2, s2.arrays, {},
                      SaveOptions{.tier = Rank() == 0 ? SaveTier::kLocal : SaveTier::kPersistent})
                  .ok());
  Status s = m->WaitUntilFinished();
  if (Size() > 1) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_TRUE(SameOnAllRanks(s));
    EXPECT_EQ(m->LatestStep()->value_or(-1), 1);
  }
}

// Saves step 0 to both tiers and step 1 to the local tier only (with
// persistent_every = 2), then closes `m`.
void SaveTwoSteps(std::unique_ptr<CheckpointManager> m) {
  ASSERT_TRUE(m);
  for (int64_t step = 0; step < 2; ++step) {
    Step s(step, Rank(), Size());
    ASSERT_TRUE(m->Save(step, s.arrays).ok());
  }
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  // Every node's lowest rank lets go of its local dir (its lease file goes)
  // before anyone touches the dirs.
  m.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 removes the local dirs of `nodes` (the nodes are lost).
void LoseNodes(const std::string& dir, const std::vector<int>& nodes) {
  // Why a barrier first: each node's lowest rank drops its local dir's lease
  // as its manager is destroyed, with no collective call after; rank 0 must
  // not list a dir while another rank still unlinks in it.
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) {
    for (int n : nodes) std::filesystem::remove_all(dir + "/node" + std::to_string(n));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// One node lost, replaced by a fresh one: step 1 comes back from the
// survivors' own files and copies, bit for bit.
TEST(TwoTiers, RecoversAfterANodeIsReplaced) {
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenTwoTier(dir));
  const int last = NodeCount(Size()) - 1;
  LoseNodes(dir, {last});
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  // One node: its loss took the only copy; the shared root's step 0 is left.
  const int64_t expected = NodeCount(Size()) > 1 ? 1 : 0;
  EXPECT_EQ(m->LatestStep()->value_or(-1), expected);
  EXPECT_TRUE(RestoreAndCheck(*m, expected, Size(), Rank()).ok());
  // The replacement takes part in the next save as any node.
  Step s(2, Rank(), Size());
  ASSERT_TRUE(m->Save(2, s.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 2, Size(), Rank(), RestoreSource::kLocal).ok());
}

// Both nodes of a pair lost (a rank's own file and its only copy): the
// newest step of the shared root is used.
TEST(TwoTiers, LosingAPartnerPairFallsBackToTheSharedRoot) {
  if (NodeCount(Size()) < 2) GTEST_SKIP() << "needs two nodes";
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenTwoTier(dir));
  LoseNodes(dir, {0, 1});
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  ASSERT_EQ(steps->size(), 1U);
  EXPECT_EQ((*steps)[0].step, 0);
  EXPECT_FALSE((*steps)[0].local);
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank()).ok());
}

// The job comes back on fewer nodes: the first half of the ranks (their
// nodes' dirs intact, the last node's gone) restore every byte of step 1.
TEST(TwoTiers, ResumesOnFewerNodes) {
  if (NodeCount(Size()) < 2) GTEST_SKIP() << "needs two nodes";
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenTwoTier(dir));
  const int last = NodeCount(Size()) - 1;
  LoseNodes(dir, {last});
  const int survivors = last * RanksPerNode(Size());
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, Rank() < survivors ? 0 : MPI_UNDEFINED, Rank(), &comm);
  if (comm != MPI_COMM_NULL) {
    auto m = OpenTwoTier(dir, comm, Size());
    ASSERT_TRUE(m);
    EXPECT_EQ(m->LatestStep()->value_or(-1), 1);
    auto steps = m->Steps();
    ASSERT_TRUE(steps.ok());
    EXPECT_TRUE(steps->back().local);
    EXPECT_TRUE(RestoreAndCheck(*m, 1, survivors, Rank()).ok());
    m.reset();
    MPI_Comm_free(&comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A flipped byte in every node's copy of one file (rank 0's own, and the
// copy another node keeps): an agreed DataLoss naming the array. (One damaged
// copy is served from another: fallback_test.)
TEST(TwoTiers, DamagedLocalBytesAreAnAgreedDataLoss) {
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenTwoTier(dir));
  if (Rank() == 0) {
    for (int n = 0; n < NodeCount(Size()); ++n) {
      // Rank 0's file, which serves rank 0's rows of "w", where a node holds it.
      const std::string path = io::StepDir(dir + "/node" + std::to_string(n), 1) + "/w0.bin";
      if (!std::filesystem::exists(path)) continue;
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      char c = 0;
      f.seekg(3);
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      f.seekp(3);
      f.write(&c, 1);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  Status s = RestoreAndCheck(*m, 1, Size(), Rank(), RestoreSource::kLocal);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
}

// XOR parity instead of copies, one rank per node, one group of all nodes:
// each node keeps 1/(g-1) of a file in parity, any one lost node's files
// are rebuilt from the others, and two lost nodes fall back to the shared root.
Options ParityOptions(const std::string& dir, int rank) {
  Options o;
  o.local_dir = dir + "/node" + std::to_string(rank);
  o.node_id = rank;
  o.persistent_every = 2;
  o.local_parity_group = Size();
  return o;
}

std::unique_ptr<CheckpointManager> OpenParity(const std::string& dir) {
  auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", ParityOptions(dir, Rank()));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

TEST(TwoTiersParity, RebuildsALostNodeFromParity) {
  if (Size() < 3) GTEST_SKIP() << "a parity group of three nodes or more";
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenParity(dir));
  if (Rank() == 0) {
    // Parity, not copies: each node holds its own file and a block of
    // 1/(g-1) of the largest file.
    const std::string step = io::StepDir(dir + "/node1", 1);
    EXPECT_TRUE(std::filesystem::exists(step + "/w1.bin"));
    EXPECT_FALSE(std::filesystem::exists(step + "/w0.bin"));
    const auto own = std::filesystem::file_size(step + "/w1.bin");
    const auto block = std::filesystem::file_size(step + "/p1.bin");
    EXPECT_LE(block, own / static_cast<uintmax_t>(Size() - 1) + 512) << own;
  }
  LoseNodes(dir, {1});
  auto m = OpenParity(dir);
  ASSERT_TRUE(m);
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  ASSERT_FALSE(steps->empty());
  EXPECT_EQ(steps->back().step, 1);
  EXPECT_TRUE(steps->back().local);
  EXPECT_TRUE(RestoreAndCheck(*m, 1, Size(), Rank(), RestoreSource::kLocal).ok());
  // Another sharding: every rank all of "w", the rebuilt rows included.
  EXPECT_TRUE(RestoreAndCheck(*m, 1, 1, 0, RestoreSource::kLocal).ok());
}

TEST(TwoTiersParity, TwoLostNodesOfAGroupFallBack) {
  if (Size() < 3) GTEST_SKIP() << "a parity group of three nodes or more";
  const std::string dir = FreshDir();
  SaveTwoSteps(OpenParity(dir));
  LoseNodes(dir, {0, 2});
  auto m = OpenParity(dir);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->LatestStep()->value_or(-1), 0);
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_FALSE(steps->back().local);
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank()).ok());
}

// A shared root that hangs in the middle of a write (the last rank's, held
// by a gate file): with persistent_deadline_seconds the save is abandoned with
// an agreed error, the next saves stay in the local tier, and once the write
// ends the shared root gets saves again; the abandoned step has no marker.
TEST(TwoTiersDeadline, AStuckSharedRootIsAbandonedAndTrainingGoesOn) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/release";
  ASSERT_TRUE(fault::Configure(fmt::format("rank={},point=mid_write,action=wait,file={},step=1",
                                           Size() - 1, gate))
                  .ok());
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_every = 1;
  o.persistent_deadline_seconds = 2;
  auto opened = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto m = std::move(opened).value();
  if (!m->async()) {
    fault::Configure("").IgnoreError();
    GTEST_SKIP() << "needs MPI_THREAD_MULTIPLE";
  }
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size()), s2(2, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  ASSERT_TRUE(m->Save(1, s1.arrays).ok());
  Status late = m->WaitUntilFinished();  // the write of step 1 hangs on the last rank
  EXPECT_EQ(late.code(), StatusCode::kIoError) << late.ToString();
  EXPECT_NE(late.message().find("step 1"), std::string::npos) << late.ToString();
  EXPECT_NE(late.message().find("abandoned"), std::string::npos) << late.ToString();
  EXPECT_TRUE(SameOnAllRanks(late));
  // Training goes on: step 2 commits in the local tier, the shared root skipped.
  ASSERT_TRUE(m->Save(2, s2.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  EXPECT_FALSE(m->LastSaveTimings().persistent);
  EXPECT_TRUE(RestoreAndCheck(*m, 2, Size(), Rank(), RestoreSource::kLocal).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 1, Size(), Rank(), RestoreSource::kLocal).ok());
  // The write ends; a later save goes to the shared root again.
  if (Rank() == 0) std::ofstream(gate) << "go";
  MPI_Barrier(MPI_COMM_WORLD);
  bool persistent = false;
  for (int64_t step = 3; step < 40 && !persistent; ++step) {
    Step s(step, Rank(), Size());
    ASSERT_TRUE(m->Save(step, s.arrays).ok());
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    persistent = m->LastSaveTimings().persistent;
    int all = persistent ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    persistent = all != 0;
    if (!persistent) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(persistent);
  fault::Configure("").IgnoreError();
  auto steps = m->Steps();
  ASSERT_TRUE(steps.ok());
  for (const auto& t : *steps) {
    if (t.step == 1 || t.step == 2) EXPECT_FALSE(t.persistent) << "step " << t.step;
  }
  EXPECT_TRUE(steps->back().persistent);
  EXPECT_TRUE(
      RestoreAndCheck(*m, steps->back().step, Size(), Rank(), RestoreSource::kPersistent).ok());
}

// A local dir that cannot be made: Open fails on every rank alike.
TEST(TwoTiers, UnusableLocalDirFailsOpenEverywhere) {
  const std::string dir = FreshDir();
  if (Rank() == 0) {
    for (int n = 0; n < NodeCount(Size()); ++n) {
      std::ofstream(dir + "/node" + std::to_string(n)) << "a file, not a directory";
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto m =
      CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", TwoTierOptions(dir, Rank(), Size()));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(SameOnAllRanks(m.status()));
  EXPECT_NE(m.status().message().find("node0"), std::string::npos) << m.status().ToString();
}

}  // namespace
}  // namespace mhckpt
