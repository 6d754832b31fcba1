// The local tier (Options::local_dir): saves committed in node-local
// directories with copies on other nodes, the shared root every
// persistent_every-th save, and recovery after a node's local dir is gone.
// Nodes are simulated on one machine: Options::node_id puts ranks on nodes
// (2 ranks per node at 4 ranks, 1 otherwise) and each node gets its own
// local dir, DIR/node<N>. A "lost node" is a node whose dir was removed (a
// replacement node starts with an empty one).
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "base/fault.h"
#include "base/log.h"
#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"
#include "tests/tiers_test_util.h"

namespace mhckpt::tiers_test {
namespace {

Options TwoTierOptions(const std::string& dir, int rank, int size) {
  Options o;
  o.local_dir = dir + "/node" + std::to_string(NodeOf(rank, size));
  o.node_id = NodeOf(rank, size);
  o.persistent_every = 2;
  return o;
}

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

// Sets the fault `gates` (fault::Configure), then opens a two-tier manager of
// dir/shared with `o`. Returns null after a failure, or after skipping the
// test (with the gates cleared) when the manager has no drain thread: the
// gates hold the drain, which needs MPI_THREAD_MULTIPLE.
std::unique_ptr<CheckpointManager> OpenGated(const std::string& dir, const Options& o,
                                             const std::string& gates) {
  const Status set = fault::Configure(gates);
  EXPECT_TRUE(set.ok()) << set.ToString();
  if (!set.ok()) return nullptr;
  auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return nullptr;
  if (!(*m)->async()) {
    fault::Configure("").IgnoreError();
    [] { GTEST_SKIP() << "needs MPI_THREAD_MULTIPLE"; }();
    return nullptr;
  }
  return std::move(m).value();
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

// Requests that cut the checksum chunks (4 rows each) of a rank's own stored
// box, restored on the sharding of the save: each part is checked while it
// is copied, and every chunk it touches is hashed whole. Rank 0 leaves out
// its first row and flips a byte in it, in every node's copy: the chunk no
// longer matches, so the restore is an agreed DataLoss (it would pass if
// only the bytes copied were hashed). Then, intact, every rank asks for its
// rows in two parts split inside a chunk, and gets every byte.
TEST(TwoTiers, RequestsThatCutAChunkCheckItWhole) {
  const std::string dir = FreshDir();
  auto open = [&] {
    Options o = TwoTierOptions(dir, Rank(), Size());
    o.checksum_chunk_bytes = 4 * kShape[1] * sizeof(float);
    auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  };
  SaveTwoSteps(open());
  const Box mine = Rows(Size(), Rank());
  auto part = [&](int64_t from, int64_t to) {
    return Box{{mine.start[0] + from, 0}, {to - from, kShape[1]}};
  };
  auto restore = [&](CheckpointManager& m, const std::vector<Box>& boxes) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<Destination> dests;
    for (const Box& b : boxes) bufs.emplace_back(BoxBytes(b, DType::kFloat32));
    for (size_t i = 0; i < boxes.size(); ++i) dests.push_back({boxes[i], bufs[i].data()});
    RestoreOptions ro;
    ro.source = RestoreSource::kLocal;
    const std::vector<ArrayToRestore> want{{"w", DType::kFloat32, dests}};
    Status s = m.Restore(1, want, ro);
    for (size_t i = 0; s.ok() && i < boxes.size(); ++i) {
      EXPECT_TRUE(bufs[i] == Fill(DType::kFloat32, kShape, boxes[i], 1)) << BoxToString(boxes[i]);
    }
    return s;
  };
  const int64_t rows = mine.count[0];
  ASSERT_GE(rows, 3);
  {
    auto m = open();
    ASSERT_TRUE(m);
    Status s = restore(*m, {part(1, 2), part(2, rows), part(0, 1)});
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // Rank 0's file holds "r" (11 int64), then its rows of "w": both bytes
  // flipped are in its row 0.
  ASSERT_GT(DamageLocal(dir, 1, 0, {}, 11 * 8 + 3), 0);
  auto m = open();
  ASSERT_TRUE(m);
  Status s = restore(*m, {Rank() == 0 ? part(1, rows) : mine});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
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
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_every = 1;
  o.persistent_deadline_seconds = 2;
  auto m = OpenGated(
      dir, o, fmt::format("rank={},point=mid_write,action=wait,file={},step=1", Size() - 1, gate));
  if (!m) return;  // failed, or skipped without a drain thread
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

// ---- Holds, retention and the drain (Options::persistent_deadline_seconds) ----

// Creates `path` (a gate of a `wait` fault) after waiting for `after`.
std::thread OpenGateLater(const std::string& path, std::chrono::milliseconds after) {
  return std::thread([path, after] {
    std::this_thread::sleep_for(after);
    std::ofstream(path) << "go";
  });
}

// Waits until `path` exists (a gate's PATH.reached), at most 120 s.
bool WaitForFile(const std::string& path) {
  for (int i = 0; i < 2400 && !std::filesystem::exists(path); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::filesystem::exists(path);
}

// (persistent steps, local steps) of m's listing.
std::pair<std::vector<int64_t>, std::vector<int64_t>> Tiers(CheckpointManager& m) {
  std::pair<std::vector<int64_t>, std::vector<int64_t>> out;
  auto steps = m.Steps();
  EXPECT_TRUE(steps.ok()) << steps.status().ToString();
  if (!steps.ok()) return out;
  for (const auto& t : *steps) {
    if (t.persistent) out.first.push_back(t.step);
    if (t.local) out.second.push_back(t.step);
  }
  return out;
}

// Waits (up to 2 minutes) until m's local tier lists exactly `want`: a save's
// local retention runs on the I/O thread after its commit is listed, so a
// listing taken as the newest step appears may still hold the step that
// retention drops next. Returns the last listing.
std::vector<int64_t> WaitForLocalSteps(CheckpointManager& m, const std::vector<int64_t>& want) {
  std::vector<int64_t> got;
  for (int i = 0; i < 2400; ++i) {
    got = Tiers(m).second;
    if (got == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return got;
}

// A step whose every rank writes two boxes: its rows of "v" and of "w".
struct TwoBoxStep {
  std::vector<std::byte> v, w;
  std::vector<ArrayToSave> arrays;
  TwoBoxStep(int64_t step, int rank, int size) {
    const auto seed = static_cast<uint64_t>(step);
    v = Fill(DType::kFloat32, kShape, Rows(size, rank), seed + 7);
    w = Fill(DType::kFloat32, kShape, Rows(size, rank), seed);
    arrays.push_back({"v", DType::kFloat32, kShape, {Shard{Rows(size, rank), v.data()}}});
    arrays.push_back({"w", DType::kFloat32, kShape, {Shard{Rows(size, rank), w.data()}}});
  }
};

Status RestoreTwoBoxes(CheckpointManager& m, int64_t step, RestoreSource source) {
  const Box rows = Rows(Size(), Rank());
  std::vector<std::byte> v(BoxBytes(rows, DType::kFloat32)), w(v.size());
  std::vector<ArrayToRestore> want{{"v", DType::kFloat32, {Destination{rows, v.data()}}},
                                   {"w", DType::kFloat32, {Destination{rows, w.data()}}}};
  RestoreOptions ro;
  ro.source = source;
  Status s = m.Restore(step, want, ro);
  if (s.ok()) {
    const auto seed = static_cast<uint64_t>(step);
    EXPECT_TRUE(v == Fill(DType::kFloat32, kShape, rows, seed + 7)) << "step " << step;
    EXPECT_TRUE(w == Fill(DType::kFloat32, kShape, rows, seed)) << "step " << step;
  }
  return s;
}

const SaveOptions kLocalOnly{.tier = SaveTier::kLocal};
const SaveOptions kBothTiers{.tier = SaveTier::kPersistent};

// The drain of step 1 reads each rank's local file of step 1; its write is
// held (a gate mid-write on the last rank) while steps 2-4 are saved to the
// local tier. Step 1 is held: it is neither recycled nor dropped (the local
// tier keeps one more step), so the shared root commits step 1's own bytes;
// once the drain has ended, the next save drops it.
TEST(TwoTiersDrain, AHeldStepIsNeitherRecycledNorDropped) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/release";
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_deadline_seconds = 300;  // never reached here
  o.local_max_to_keep = 2;
  auto m = OpenGated(
      dir, o, fmt::format("rank={},point=mid_write,action=wait,file={},step=1", Size() - 1, gate));
  if (!m) return;  // failed, or skipped without a drain thread
  std::vector<std::unique_ptr<TwoBoxStep>> steps;
  for (int64_t step = 0; step < 6; ++step) {
    steps.push_back(std::make_unique<TwoBoxStep>(step, Rank(), Size()));
  }
  ASSERT_TRUE(m->Save(0, steps[0]->arrays, {}, kBothTiers).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  ASSERT_TRUE(m->Save(1, steps[1]->arrays, {}, kBothTiers).ok());  // its drain waits at the gate
  for (int64_t step = 2; step <= 4; ++step) {
    ASSERT_TRUE(m->Save(step, steps[static_cast<size_t>(step)]->arrays, {}, kLocalOnly).ok());
  }
  // Step 1 is still read by its drain: kept, one more step than local_max_to_keep.
  EXPECT_EQ(WaitForLocalSteps(*m, {1, 3, 4}), (std::vector<int64_t>{1, 3, 4}));
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == Size() - 1) std::ofstream(gate) << "go";
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  fault::Configure("").IgnoreError();
  // The shared root's step 1 holds step 1's bytes, under step 1's checksums.
  EXPECT_TRUE(m->Verify(1).ok());
  EXPECT_TRUE(RestoreTwoBoxes(*m, 1, RestoreSource::kPersistent).ok());
  for (int64_t step : {3, 4}) EXPECT_TRUE(RestoreTwoBoxes(*m, step, RestoreSource::kLocal).ok());
  // Unheld now: the next save drops it.
  ASSERT_TRUE(m->Save(5, steps[5]->arrays, {}, kLocalOnly).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  EXPECT_EQ(Tiers(*m), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0, 1}, {4, 5}}));
  for (int64_t step : {4, 5}) EXPECT_TRUE(RestoreTwoBoxes(*m, step, RestoreSource::kLocal).ok());
}

// A save that fails in the local tier, at any point of it, leaves every
// committed step of both tiers as it was (no step recycled before the
// commit is agreed), with the same error on every rank; the next save
// recycles as usual.
TEST(TwoTiers, AFailedSaveLeavesEveryCommittedStep) {
  const int last_leader = (NodeCount(Size()) - 1) * RanksPerNode(Size());
  for (const std::string point :
       {"local_create", "local_write", "local_exchange", "before_local_marker"}) {
    SCOPED_TRACE(point);
    const std::string dir = FreshDir(point);
    auto m = OpenTwoTier(dir);
    ASSERT_TRUE(m);
    for (int64_t step = 0; step < 3; ++step) {
      Step s(step, Rank(), Size());
      ASSERT_TRUE(m->Save(step, s.arrays, {}, step == 0 ? kBothTiers : kLocalOnly).ok());
      ASSERT_TRUE(m->WaitUntilFinished().ok());
    }
    const auto before = Tiers(*m);
    ASSERT_EQ(before, (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0}, {1, 2}}));
    ASSERT_TRUE(
        fault::Configure(fmt::format("rank={},point={},action=eio,step=3", last_leader, point))
            .ok());
    Step s3(3, Rank(), Size());
    (void)m->Save(3, s3.arrays, {}, kLocalOnly);
    Status failed = m->WaitUntilFinished();
    fault::Configure("").IgnoreError();
    EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
    EXPECT_TRUE(SameOnAllRanks(failed));
    EXPECT_EQ(Tiers(*m), before);
    for (int64_t step : {1, 2}) {
      EXPECT_TRUE(RestoreAndCheck(*m, step, Size(), Rank(), RestoreSource::kLocal).ok()) << step;
    }
    EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kPersistent).ok());
    Step s4(4, Rank(), Size());
    ASSERT_TRUE(m->Save(4, s4.arrays, {}, kLocalOnly).ok());
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_EQ(Tiers(*m), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0}, {2, 4}}));
    EXPECT_TRUE(RestoreAndCheck(*m, 4, Size(), Rank(), RestoreSource::kLocal).ok());
  }
}

// Delete removes a step from both tiers on every node, durably (a new job
// lists the same), or from the one tier that holds it; a missing step is an
// agreed NotFound; the tiers' other steps restore as saved, and saves go on.
TEST(TwoTiers, DeleteRemovesAStepFromEveryTierAndNode) {
  using Listing = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
  const std::string dir = FreshDir();
  {
    auto m = OpenTwoTier(dir);
    ASSERT_TRUE(m);
    for (int64_t step = 0; step < 3; ++step) {
      Step s(step, Rank(), Size());
      ASSERT_TRUE(m->Save(step, s.arrays, {}, step == 1 ? kLocalOnly : kBothTiers).ok());
    }
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    ASSERT_EQ(Tiers(*m), (Listing{{0, 2}, {1, 2}}));
    ASSERT_TRUE(m->Delete(2).ok());
    EXPECT_EQ(Tiers(*m), (Listing{{0}, {1}}));
    ASSERT_TRUE(m->Delete(1).ok());
    EXPECT_EQ(Tiers(*m), (Listing{{0}, {}}));
    Status missing = m->Delete(1);
    EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
    EXPECT_TRUE(SameOnAllRanks(missing));
    EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank()).ok());
    Step s3(3, Rank(), Size());
    ASSERT_TRUE(m->Save(3, s3.arrays, {}, kLocalOnly).ok());
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_EQ(Tiers(*m), (Listing{{0}, {3}}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto m = OpenTwoTier(dir);
  ASSERT_TRUE(m);
  EXPECT_EQ(Tiers(*m), (Listing{{0}, {3}}));
  EXPECT_TRUE(RestoreAndCheck(*m, 3, Size(), Rank(), RestoreSource::kLocal).ok());
}

// A node away from the job that deletes a step keeps its local files of it.
// When the node rejoins, the step stays deleted (the shared root records the
// deletion) and the node's files of it go: step 1, which the job held
// locally, and step 0, which only the shared root and the node away held. A
// later save of the same step number is restored. Every node keeps a copy
// of every file, so that the node away could restore the steps on its own.
TEST(TwoTiers, ADeletedStepStaysDeletedWhenANodeThatWasAwayRejoins) {
  if (NodeCount(Size()) < 2) GTEST_SKIP() << "needs two nodes";
  using Listing = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
  const std::string dir = FreshDir();
  auto open = [&](MPI_Comm comm) -> std::unique_ptr<CheckpointManager> {
    Options o = TwoTierOptions(dir, Rank(), Size());
    o.local_copies = NodeCount(Size()) - 1;
    auto m = CheckpointManager::Open(comm, dir + "/shared", o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  };
  SaveTwoSteps(open(MPI_COMM_WORLD));
  const int away = NodeCount(Size()) - 1;
  auto step_dir = [&](int node, int64_t step) {
    return fmt::format("{}/node{}/{}", dir, node, io::StepDirName(step));
  };
  if (Rank() == 0) {
    for (int node = 0; node < away; ++node) std::filesystem::remove_all(step_dir(node, 0));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, Rank() < away * RanksPerNode(Size()) ? 0 : MPI_UNDEFINED, Rank(),
                 &comm);
  if (comm != MPI_COMM_NULL) {
    auto m = open(comm);
    ASSERT_TRUE(m);
    EXPECT_EQ(Tiers(*m), (Listing{{0}, {1}}));
    EXPECT_TRUE(m->Delete(1).ok());
    EXPECT_EQ(Tiers(*m), (Listing{{0}, {}}));
    EXPECT_TRUE(m->Delete(0).ok());
    EXPECT_EQ(Tiers(*m), (Listing{{}, {}}));
    m.reset();
    MPI_Comm_free(&comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(std::filesystem::exists(step_dir(away, 0))) << "the node away kept its files";
  EXPECT_TRUE(std::filesystem::exists(step_dir(away, 1))) << "the node away kept its files";
  {
    auto m = open(MPI_COMM_WORLD);
    ASSERT_TRUE(m);
    EXPECT_EQ(Tiers(*m), (Listing{{}, {}}));
    EXPECT_FALSE(m->LatestStep()->has_value());
    EXPECT_FALSE(std::filesystem::exists(step_dir(away, 0)));
    EXPECT_FALSE(std::filesystem::exists(step_dir(away, 1)));
    Step s(1, Rank(), Size());
    ASSERT_TRUE(m->Save(1, s.arrays, {}, kLocalOnly).ok());
    ASSERT_TRUE(m->WaitUntilFinished().ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto m = open(MPI_COMM_WORLD);
  ASSERT_TRUE(m);
  EXPECT_EQ(Tiers(*m), (Listing{{}, {1}}));
  EXPECT_TRUE(RestoreAndCheck(*m, 1, Size(), Rank(), RestoreSource::kLocal).ok());
}

// In drain mode Delete waits for the drain that reads the step (held at a
// gate mid-write, released a second later), then removes the step from both
// tiers: nothing of it is left to commit late.
TEST(TwoTiersDrain, DeleteWaitsForTheStepsDrain) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/release";
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_deadline_seconds = 300;  // never reached here
  auto m = OpenGated(
      dir, o, fmt::format("rank={},point=mid_write,action=wait,file={},step=1", Size() - 1, gate));
  if (!m) return;  // failed, or skipped without a drain thread
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays, {}, kBothTiers).ok());
  ASSERT_TRUE(m->Save(1, s1.arrays, {}, kBothTiers).ok());  // its drain waits at the gate
  std::thread release;
  if (Rank() == Size() - 1) release = OpenGateLater(gate, std::chrono::milliseconds(1000));
  Status deleted = m->Delete(1);
  if (release.joinable()) release.join();
  fault::Configure("").IgnoreError();
  ASSERT_TRUE(deleted.ok()) << deleted.ToString();
  EXPECT_EQ(Tiers(*m), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0}, {0}}));
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kPersistent).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kLocal).ok());
}

// In drain mode retention runs on the drain thread only. The drain of step
// 2 retires step 0 and waits (a gate at `retention` on rank 0, step 0's
// marker gone); meanwhile a local-only save must not run retention of its
// own on the I/O thread: step 1 stays committed until the drain's retention
// goes on.
TEST(TwoTiersDrain, RetentionRunsOnOneThread) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/retention";
  {
    Options plain;
    plain.max_to_keep = 0;
    auto first = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", plain);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    for (int64_t step = 0; step < 2; ++step) {
      Step s(step, Rank(), Size());
      ASSERT_TRUE((*first)->Save(step, s.arrays).ok());
    }
    ASSERT_TRUE((*first)->WaitUntilFinished().ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.max_to_keep = 1;
  o.persistent_deadline_seconds = 2;
  auto m =
      OpenGated(dir, o, fmt::format("rank=0,point=retention,action=wait,file={},step=2", gate));
  if (!m) return;  // failed, or skipped without a drain thread
  Step s2(2, Rank(), Size()), s3(3, Rank(), Size());
  ASSERT_TRUE(m->Save(2, s2.arrays, {}, kBothTiers).ok());
  if (Rank() == 0) ASSERT_TRUE(WaitForFile(gate + ".reached"));
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_TRUE(m->Save(3, s3.arrays, {}, kLocalOnly).ok());
  // The drain's retention is past the deadline: not waited for, not an error.
  EXPECT_TRUE(m->WaitUntilFinished().ok());
  if (Rank() == 0) {
    EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir + "/shared", 0)));
    EXPECT_TRUE(std::filesystem::exists(io::MarkerPath(dir + "/shared", 1)))
        << "step 1 was retired while the drain's retention was still running";
    std::ofstream(gate) << "go";
    // The retention goes on and retires step 1 (the next save would skip the
    // shared root while the drain thread is late).
    for (int i = 0; i < 2400 && std::filesystem::exists(io::MarkerPath(dir + "/shared", 1)); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Step s4(4, Rank(), Size());
  ASSERT_TRUE(m->Save(4, s4.arrays, {}, kBothTiers).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  fault::Configure("").IgnoreError();
  EXPECT_EQ(Tiers(*m).first, (std::vector<int64_t>{4}));
  EXPECT_TRUE(m->Verify(4).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 4, Size(), Rank(), RestoreSource::kPersistent).ok());
}

// WaitUntilFinished gives each shared root's part persistent_deadline_seconds
// from its own start: step 1's part, queued behind step 0's (held 2.5 s by a
// gate), starts late and ends within its own deadline though not within the
// deadline from the call; both steps are committed and nothing is abandoned.
TEST(TwoTiersDrain, EachDrainHasItsDeadlineFromItsStart) {
  const std::string dir = FreshDir();
  const std::string g0 = dir + "/g0", g1 = dir + "/g1";
  const int last = Size() - 1;
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_every = 1;
  o.persistent_deadline_seconds = 4;
  auto m = OpenGated(dir, o,
                     fmt::format("rank={0},point=mid_write,action=wait,file={1},step=0;"
                                 "rank={0},point=mid_write,action=wait,file={2},step=1",
                                 last, g0, g1));
  if (!m) return;  // failed, or skipped without a drain thread
  std::thread opener;
  if (Rank() == last) {
    // Each gate opens 2.5 s after its drain reached it.
    opener = std::thread([g0, g1] {
      for (const std::string& g : {g0, g1}) {
        if (!WaitForFile(g + ".reached")) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        std::ofstream(g) << "go";
      }
    });
  }
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  ASSERT_TRUE(m->Save(1, s1.arrays).ok());
  Status s = m->WaitUntilFinished();
  if (opener.joinable()) opener.join();
  fault::Configure("").IgnoreError();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(Tiers(*m).first, (std::vector<int64_t>{0, 1}));
  for (int64_t step : {0, 1}) {
    EXPECT_TRUE(m->Verify(step).ok()) << step;
    EXPECT_TRUE(RestoreAndCheck(*m, step, Size(), Rank(), RestoreSource::kPersistent).ok());
  }
}

// A drain held just before its marker (rank 0, `before_marker`) past the
// deadline is abandoned; once it goes on it puts no marker.
TEST(TwoTiersDrain, AnAbandonedDrainHeldBeforeItsMarkerPutsNone) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/release";
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_every = 1;
  o.persistent_deadline_seconds = 2;
  auto m =
      OpenGated(dir, o, fmt::format("rank=0,point=before_marker,action=wait,file={},step=1", gate));
  if (!m) return;  // failed, or skipped without a drain thread
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  ASSERT_TRUE(m->Save(1, s1.arrays).ok());
  Status late = m->WaitUntilFinished();
  EXPECT_EQ(late.code(), StatusCode::kIoError) << late.ToString();
  EXPECT_NE(late.message().find("abandoned"), std::string::npos) << late.ToString();
  EXPECT_TRUE(SameOnAllRanks(late));
  if (Rank() == 0) {
    ASSERT_TRUE(WaitForFile(gate + ".reached"));
    std::ofstream(gate) << "go";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Closing the manager waits for the part to end (its outcome, abandoned,
  // is not reported again).
  m.reset();
  fault::Configure("").IgnoreError();
  MPI_Barrier(MPI_COMM_WORLD);
  auto again = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const auto tiers = Tiers(**again);
  EXPECT_EQ(tiers.first, (std::vector<int64_t>{0}));
  EXPECT_EQ(tiers.second, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(RestoreAndCheck(**again, 1, Size(), Rank(), RestoreSource::kLocal).ok());
}

// Without a drain, a save to both tiers whose local commit failed but whose
// shared root commit succeeded is followed by the shared root's retention.
TEST(TwoTiers, RetentionFollowsASharedCommitAfterALocalFailure) {
  const std::string dir = FreshDir();
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.max_to_keep = 1;
  auto opened = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto m = std::move(opened).value();
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays, {}, kBothTiers).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  ASSERT_TRUE(
      fault::Configure(fmt::format("rank={},point=local_write,action=eio,step=1", Size() - 1))
          .ok());
  (void)m->Save(1, s1.arrays, {}, kBothTiers);
  Status failed = m->WaitUntilFinished();
  fault::Configure("").IgnoreError();
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
  EXPECT_TRUE(SameOnAllRanks(failed));
  EXPECT_EQ(Tiers(*m), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{1}, {0}}));
  EXPECT_TRUE(RestoreAndCheck(*m, 1, Size(), Rank(), RestoreSource::kPersistent).ok());
}

// A save whose local commit failed is not drained from its staging buffer:
// the buffer goes back at once, so the next Save (default staging budget:
// one save's worth) does not wait for a stuck shared file system.
TEST(TwoTiersDrain, AFailedLocalCommitGivesItsStagingBack) {
  const std::string dir = FreshDir();
  const std::string gate = dir + "/release";
  const int last = Size() - 1;
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.persistent_every = 1;
  o.persistent_deadline_seconds = 60;
  auto m = OpenGated(dir, o,
                     fmt::format("rank={0},point=local_write,action=eio,step=1;"
                                 "rank={0},point=mid_write,action=wait,file={1},step=1",
                                 last, gate));
  if (!m) return;  // failed, or skipped without a drain thread
  Step s0(0, Rank(), Size()), s1(1, Rank(), Size()), s2(2, Rank(), Size());
  ASSERT_TRUE(m->Save(0, s0.arrays).ok());
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  // Were step 1 drained from staging, the gate would hold it 8 s.
  std::thread opener;
  if (Rank() == last) opener = OpenGateLater(gate, std::chrono::milliseconds(8000));
  ASSERT_TRUE(m->Save(1, s1.arrays).ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(m->Save(2, s2.arrays, {}, kLocalOnly).ok());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 4.0) << "the next Save waited for the shared root's write";
  Status failed = m->WaitUntilFinished();
  if (opener.joinable()) opener.join();
  fault::Configure("").IgnoreError();
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed.ToString();
  EXPECT_TRUE(SameOnAllRanks(failed));
  EXPECT_EQ(Tiers(*m), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0}, {0, 2}}));
  EXPECT_TRUE(RestoreAndCheck(*m, 2, Size(), Rank(), RestoreSource::kLocal).ok());
}

// A lazy save whose copier thread cannot be started copies on the caller's
// thread, at the caller's priority: the caller's nice value is unchanged.
TEST(LazyCopier, TheCallersPriorityIsNeverChanged) {
  const std::string dir = FreshDir();
  auto opened = CheckpointManager::Open(MPI_COMM_WORLD, dir, Options{});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto m = std::move(opened).value();
  if (!m->async()) GTEST_SKIP() << "lazy saves need MPI_THREAD_MULTIPLE";
  const auto self = static_cast<id_t>(gettid());
  errno = 0;
  const int before = getpriority(PRIO_PROCESS, self);
  ASSERT_EQ(errno, 0);
  ASSERT_TRUE(fault::Configure("point=copier_thread,action=eio").ok());
  Step s(0, Rank(), Size());
  SaveFence fence;
  ASSERT_TRUE(m->Save(0, s.arrays, {}, SaveOptions{.copy = CopyMode::kLazy}, &fence).ok());
  EXPECT_TRUE(fence.Wait().ok());
  const int after = getpriority(PRIO_PROCESS, self);
  EXPECT_GE(fault::Fired(), 1);
  fault::Configure("").IgnoreError();
  (void)setpriority(PRIO_PROCESS, self, before);  // for the tests after this one
  EXPECT_EQ(after, before);
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank()).ok());
}

// Nodes of unequal size with parity (3 ranks: nodes of 2 and 1): rank 1 is
// alone at its position, in no parity group. Open says so once (rank 0); a
// lost node 0 takes rank 1's only file, so step 1 is not restorable from the
// local tier and the shared root's step 0 is used; a lost node 1 (rank 2,
// in a group with rank 0) is rebuilt from parity.
TEST(TwoTiersParity, ARankAloneAtItsPositionIsNotProtected) {
  if (Size() != 3) GTEST_SKIP() << "nodes of 2 and 1 ranks";
  auto options = [](const std::string& dir) {
    Options o;
    o.node_id = Rank() < 2 ? 0 : 1;
    o.local_dir = dir + "/node" + std::to_string(o.node_id);
    o.persistent_every = 2;
    o.local_parity_group = 2;
    return o;
  };
  for (int lost : {0, 1}) {
    SCOPED_TRACE(lost);
    const std::string dir = FreshDir(std::to_string(lost));
    auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(200);
    SetLogger(std::make_shared<spdlog::logger>("test", sink));
    {
      auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", options(dir));
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      SaveTwoSteps(std::move(m).value());
    }
    SetLogger(nullptr);
    int said = 0;
    for (const std::string& line : sink->last_formatted()) {
      if (line.find("rank(s) 1 of 3 have no parity group") != std::string::npos) ++said;
    }
    EXPECT_EQ(said, Rank() == 0 ? 1 : 0);
    LoseNodes(dir, {lost});
    auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", options(dir));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const auto tiers = Tiers(**m);
    if (lost == 0) {
      EXPECT_EQ(tiers.second, std::vector<int64_t>{});
      EXPECT_EQ((*m)->LatestStep()->value_or(-1), 0);
      Status not_local = RestoreAndCheck(**m, 1, Size(), Rank(), RestoreSource::kLocal);
      EXPECT_EQ(not_local.code(), StatusCode::kNotFound) << not_local.ToString();
      EXPECT_TRUE(RestoreAndCheck(**m, 0, Size(), Rank()).ok());
    } else {
      EXPECT_EQ(tiers.second, (std::vector<int64_t>{0, 1}));
      EXPECT_TRUE(RestoreAndCheck(**m, 1, Size(), Rank(), RestoreSource::kLocal).ok());
    }
  }
}

// Run only by ctest's local_tier.watchdog_open (MHCKPT_FAULT hangs a node's
// lowest rank inside LocalTier::Open): the watchdog must abort the job.
TEST(TwoTiersWatchdog, DISABLED_AStuckLocalOpenIsAborted) {
  const std::string dir = FreshDir();
  Options o = TwoTierOptions(dir, Rank(), Size());
  o.collective_timeout_seconds = 3;
  auto m = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
  ADD_FAILURE() << "Open returned (" << m.status().ToString()
                << ") instead of the watchdog aborting";
}

// The landing file's tests: a manager with a local tier whose saves after
// the first stay local (checksum chunks of `chunk_bytes` if not 0), and the
// inode of a path (-1 if absent), by which a test sees a file moved.
struct LandingCase {
  explicit LandingCase(uint64_t chunk_bytes = 0)
      : dir(FreshDir()), o(TwoTierOptions(dir, Rank(), Size())) {
    o.persistent_every = 100;  // the first save goes to both tiers, the rest stay local
    o.checksum_chunk_bytes = chunk_bytes;
    landing = fmt::format("{}/landing-r{}.bin", o.local_dir, Rank());
  }
  Status Open() {
    auto opened = CheckpointManager::Open(MPI_COMM_WORLD, dir + "/shared", o);
    if (!opened.ok()) return opened.status();
    m = std::move(opened).value();
    return OkStatus();
  }
  static int64_t Inode(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_ino) : -1;
  }
  // The inode of rank 0's file of local step `step`.
  [[nodiscard]] int64_t StepFile(int64_t step) const {
    return Inode(io::StepDir(o.local_dir, step) + "/w0.bin");
  }
  std::string dir;
  Options o;
  std::string landing;
  std::unique_ptr<CheckpointManager> m;
};

// Lazy saves to the local tier stage in each rank's landing file, which the
// local write moves into the step (one copy of the bytes, hashed on the way):
// each step restores exactly what was saved, though the caller wrote its
// arrays once the fence completed; its chunk checksums (several per box)
// hold. At one rank (every box planned there, back to back as staged) each
// step's file is the file the landing held when the save began.
TEST(LocalLanding, LazySavesLandInTheStepsFiles) {
  LandingCase c(40);  // two rows of "w" per chunk
  ASSERT_TRUE(c.Open().ok());
  CheckpointManager* m = c.m.get();
  if (!m->async()) GTEST_SKIP() << "lazy saves need MPI_THREAD_MULTIPLE";
  for (int64_t step = 0; step < 7; ++step) {
    SCOPED_TRACE(step);
    const int64_t before = LandingCase::Inode(c.landing);
    Step s(step, Rank(), Size());
    SaveFence fence;
    ASSERT_TRUE(m->Save(step, s.arrays, {}, SaveOptions{.copy = CopyMode::kLazy}, &fence).ok());
    ASSERT_TRUE(fence.Wait().ok());
    std::fill(s.w.begin(), s.w.end(), std::byte{0x7f});
    std::fill(s.r.begin(), s.r.end(), std::byte{0x7f});
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_TRUE(RestoreAndCheck(*m, step, Size(), Rank(), RestoreSource::kLocal).ok());
    if (Size() == 1 && before >= 0) EXPECT_EQ(c.StepFile(step), before);
  }
  for (int64_t step : {5, 6})
    EXPECT_TRUE(RestoreAndCheck(*m, step, 1, 0, RestoreSource::kLocal).ok());
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kPersistent).ok());
}

// A blocking save to the local tier lands in the rank's landing file too
// once an earlier save has left it warm (its pages in place) and no save holds
// it: it returns once copied, and the caller may then write its arrays at
// once. Lazy saves warm the files; step 6's commit is left in flight, so that
// the blocking save after it may find the landing file held and stage in
// memory. Every step restores exactly what was saved; at one rank, a blocking
// save after the warm-up is the file the landing held when it began.
TEST(LocalLanding, BlockingSavesLandOnceTheFileIsWarm) {
  LandingCase c;
  ASSERT_TRUE(c.Open().ok());
  CheckpointManager* m = c.m.get();
  if (!m->async()) GTEST_SKIP() << "lazy saves need MPI_THREAD_MULTIPLE";
  for (int64_t step = 0; step < 10; ++step) {
    SCOPED_TRACE(step);
    const bool lazy = step < 4 || step == 6;
    const int64_t before = LandingCase::Inode(c.landing);
    Step s(step, Rank(), Size());
    SaveFence fence;
    const SaveOptions so{.copy = lazy ? CopyMode::kLazy : CopyMode::kBlocking};
    ASSERT_TRUE(m->Save(step, s.arrays, {}, so, &fence).ok());
    ASSERT_TRUE(fence.Done() || lazy);
    ASSERT_TRUE(fence.Wait().ok());
    std::fill(s.w.begin(), s.w.end(), std::byte{0x7f});
    std::fill(s.r.begin(), s.r.end(), std::byte{0x7f});
    if (step == 6) continue;
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_TRUE(RestoreAndCheck(*m, step, Size(), Rank(), RestoreSource::kLocal).ok());
    if (Size() == 1 && !lazy && step != 7) {
      EXPECT_GE(before, 0);
      EXPECT_EQ(c.StepFile(step), before);
    }
  }
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kPersistent).ok());
}

// Blocking saves alone warm the landing files: the local write copies a
// staged save into the landing file (when no later save holds it) and moves
// it into the step, so that its mapping is kept; once the files of the
// rotation have been through it, every blocking save lands directly (at one
// rank: its step's file is the file the landing held when it began).
TEST(LocalLanding, BlockingSavesAloneWarmTheLandingFiles) {
  LandingCase c;
  ASSERT_TRUE(c.Open().ok());
  CheckpointManager* m = c.m.get();
  if (!m->async()) GTEST_SKIP() << "the local write runs on the I/O thread";
  int landed = 0;
  const int64_t steps = 12;
  const int64_t warm = c.o.local_max_to_keep + 2;
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(step);
    const int64_t before = LandingCase::Inode(c.landing);
    Step s(step, Rank(), Size());
    ASSERT_TRUE(m->Save(step, s.arrays, {}).ok());
    std::fill(s.w.begin(), s.w.end(), std::byte{0x7f});
    std::fill(s.r.begin(), s.r.end(), std::byte{0x7f});
    ASSERT_TRUE(m->WaitUntilFinished().ok());
    EXPECT_TRUE(RestoreAndCheck(*m, step, Size(), Rank(), RestoreSource::kLocal).ok());
    const bool in_place = before >= 0 && c.StepFile(step) == before;
    landed += in_place ? 1 : 0;
    if (Size() == 1 && step >= warm) EXPECT_TRUE(in_place);
  }
  if (Size() == 1) EXPECT_GE(landed, steps - warm);
  EXPECT_TRUE(RestoreAndCheck(*m, 0, Size(), Rank(), RestoreSource::kPersistent).ok());
}

}  // namespace
}  // namespace mhckpt::tiers_test
