// A damaged copy is a reason to use another, not to stop: a restore of a
// local step serves a damaged piece from another node's copy or from parity,
// and RestoreLatest restores the newest step that restores intact — local,
// then shared — skipping the damaged ones, the same step on every rank.
// Nodes are simulated on one machine as in local_tier_test: Options::node_id
// (2 ranks per node at 4 ranks, 1 otherwise), each node with its own local
// dir, DIR/node<N>. Damage is two flipped bytes of a writer file (w<R>.bin)
// of a local step, or of an array's bytes in a shared root step's data file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "io/marker.h"
#include "tests/test_util.h"
#include "tests/tiers_test_util.h"

namespace mhckpt::tiers_test {
namespace {

// This rank's rows out of `parts` of "w", and all of "r", to restore into.
struct Target {
  Box rows;
  std::vector<std::byte> w, r;
  std::vector<ArrayToRestore> arrays;
  Target(int parts, int part)
      : rows(Rows(parts, part)), w(BoxBytes(rows, DType::kFloat32)), r(11 * 8) {
    arrays = {{"w", DType::kFloat32, {Destination{rows, w.data()}}},
              {"r", DType::kInt64, {Destination{FullBox({11}), r.data()}}}};
  }
  // The bytes are those saved at `step`.
  [[nodiscard]] bool Holds(int64_t step) const {
    const auto seed = static_cast<uint64_t>(step);
    return w == Fill(DType::kFloat32, kShape, rows, seed) &&
           r == Fill(DType::kInt64, {11}, FullBox({11}), seed + 100);
  }
};

Options TwoTierOptions(const std::string& dir, int persistent_every, int parity = 0) {
  Options o;
  o.local_dir = dir + "/node" + std::to_string(NodeOf(Rank(), Size()));
  o.node_id = NodeOf(Rank(), Size());
  o.persistent_every = persistent_every;
  o.local_parity_group = parity;
  return o;
}

std::unique_ptr<CheckpointManager> Open(const std::string& dir, int persistent_every,
                                        int parity = 0) {
  auto m = testing::OpenAgreed(dir + "/shared", TwoTierOptions(dir, persistent_every, parity));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Restores `step` from the local tier only, into `t`.
Status RestoreLocal(CheckpointManager& m, int64_t step, Target& t) {
  RestoreOptions ro;
  ro.source = RestoreSource::kLocal;
  return m.Restore(step, t.arrays, ro);
}

// Saves steps 0..count-1 and closes the manager; every node's lowest rank
// lets go of its local dir before anyone touches the dirs.
void SaveSteps(std::unique_ptr<CheckpointManager> m, int count) {
  ASSERT_TRUE(m);
  for (int64_t step = 0; step < count; ++step) {
    Step s(step, Rank(), Size());
    ASSERT_TRUE(m->Save(step, s.arrays).ok());
  }
  ASSERT_TRUE(m->WaitUntilFinished().ok());
  m.reset();
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 flips two bytes of array "w" in shared root step `step`'s data file.
void DamageShared(const std::string& dir, int64_t step) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) {
    const std::string root = dir + "/shared";
    Result<io::Marker> m = io::ReadMarker(io::MarkerPath(root, step));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const io::MarkerArray* w = m->Find("w");
    ASSERT_NE(w, nullptr);
    ASSERT_GE(w->offset, 0);
    FlipTwoBytes(io::DataPath(root, step), static_cast<uint64_t>(w->offset) + 5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// RestoreLatest into this rank's rows; the step it restored (-1 on an
// error, whose Status goes to `*status`), checked bit for bit.
int64_t RestoreLatest(CheckpointManager& m, Status* status = nullptr, int parts = Size(),
                      int part = Rank()) {
  Target t(parts, part);
  Result<int64_t> step = m.RestoreLatest(t.arrays);
  EXPECT_TRUE(SameOnAllRanks(step.status()));
  if (status != nullptr) *status = step.status();
  if (!step.ok()) return -1;
  EXPECT_TRUE(t.Holds(*step)) << "step " << *step << " restored other bytes";
  int64_t agreed[2] = {*step, -*step};
  MPI_Allreduce(MPI_IN_PLACE, agreed, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(agreed[0], -agreed[1]) << "ranks restored different steps";
  return *step;
}

#define REQUIRE_NODES() \
  if (NodeCount(Size()) < 2) GTEST_SKIP() << "needs two nodes or more"

// (a) Two flipped bytes in node 0's own file of the newest local step: the
// restore of that step is served from node 1's copy, bit for bit, at the
// save's sharding and another; the newest step is the one restored.
TEST(Fallback, DamagedOwnFileIsServedFromTheCopy) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 2), 2);  // 0: both tiers; 1: local only
  ASSERT_EQ(DamageLocal(dir, 1, 0, {0}), 1);
  auto m = Open(dir, 2);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->LatestStep()->value_or(-1), 1);
  for (int parts : {Size(), 1}) {
    Target t(parts, parts == 1 ? 0 : Rank());
    Status s = m->Restore(1, t.arrays);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(SameOnAllRanks(s));
    EXPECT_TRUE(t.Holds(1)) << "at " << parts << " parts";
  }
  EXPECT_EQ(RestoreLatest(*m), 1);
}

// Every copy of one writer file damaged: Restore of that step is an agreed
// DataLoss naming the array, the box and every source tried.
TEST(Fallback, EveryCopyDamagedIsAnAgreedDataLossNamingWhatWasTried) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 2), 2);
  ASSERT_EQ(DamageLocal(dir, 1, 0), 2);  // rank 0's own and its one copy
  auto m = Open(dir, 2);
  ASSERT_TRUE(m);
  Target t(Size(), Rank());
  Status s = RestoreLocal(*m, 1, t);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  const std::string& msg = s.message();
  EXPECT_NE(msg.find("array '"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on node 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on node 1"), std::string::npos) << msg;
}

// (b) Every copy of one writer file of the newest local step damaged:
// RestoreLatest skips to the older local step, bit for bit, the same step on
// every rank.
TEST(Fallback, RestoreLatestSkipsToTheOlderIntactLocalStep) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 3), 3);  // shared: 0; local: 1, 2
  ASSERT_EQ(DamageLocal(dir, 2, 0), 2);
  auto m = Open(dir, 3);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->LatestStep()->value_or(-1), 2);  // committed, not verified
  EXPECT_EQ(RestoreLatest(*m), 1);
  // At another sharding too.
  EXPECT_EQ(RestoreLatest(*m, nullptr, 1, 0), 1);
  // A job restarted again makes the same choice.
  m.reset();
  MPI_Barrier(MPI_COMM_WORLD);
  m = Open(dir, 3);
  ASSERT_TRUE(m);
  EXPECT_EQ(RestoreLatest(*m), 1);
}

// (c) Every local step damaged: the shared root's step.
TEST(Fallback, RestoreLatestFallsBackToTheSharedRoot) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 3), 3);  // shared: 0; local: 1, 2
  ASSERT_EQ(DamageLocal(dir, 1, 0), 2);
  ASSERT_EQ(DamageLocal(dir, 2, 0), 2);
  auto m = Open(dir, 3);
  ASSERT_TRUE(m);
  EXPECT_EQ(RestoreLatest(*m), 0);
}

// (d) The local steps and the newest shared step damaged: the older shared
// step; with that one damaged too, NotFound naming what was skipped — never
// a wrong byte. Verify names the damaged shared steps.
TEST(Fallback, DamagedSharedStepsAreSkippedThenNotFound) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 2), 4);  // shared: 0, 2; local: 2, 3
  ASSERT_EQ(DamageLocal(dir, 2, 0), 2);
  ASSERT_EQ(DamageLocal(dir, 3, 0), 2);
  DamageShared(dir, 2);
  auto m = Open(dir, 2);
  ASSERT_TRUE(m);
  EXPECT_EQ(RestoreLatest(*m), 0);
  VerifyReport report;
  Status v = m->Verify(2, VerifyOptions{}, &report);
  EXPECT_EQ(v.code(), StatusCode::kDataLoss) << v.ToString();
  EXPECT_NE(v.message().find("step 2"), std::string::npos) << v.ToString();
  EXPECT_TRUE(m->Verify(0).ok());

  DamageShared(dir, 0);
  Status s;
  EXPECT_EQ(RestoreLatest(*m, &s), -1);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  for (const char* skipped : {"step 3 in the local tier", "step 2 in the local tier",
                              "step 2 in the shared root", "step 0 in the shared root"}) {
    EXPECT_NE(s.message().find(skipped), std::string::npos) << skipped << ": " << s.ToString();
  }
  // One tier only: the shared root's steps are not tried.
  RestoreOptions local_only;
  local_only.source = RestoreSource::kLocal;
  Target t(Size(), Rank());
  Result<int64_t> r = m->RestoreLatest(t.arrays, local_only);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_EQ(r.status().message().find("shared root"), std::string::npos) << r.status().ToString();
}

// A damaged marker in the shared root is skipped like damaged bytes.
TEST(Fallback, ADamagedSharedMarkerIsSkipped) {
  const std::string dir = FreshDir();
  {
    auto m = testing::OpenAgreed(dir + "/shared");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (int64_t step = 0; step < 2; ++step) {
      Step s(step, Rank(), Size());
      ASSERT_TRUE((*m)->Save(step, s.arrays).ok());
    }
    ASSERT_TRUE((*m)->WaitUntilFinished().ok());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) {
    // Cut in half: a marker that does not parse.
    const std::string marker = io::MarkerPath(dir + "/shared", 1);
    std::filesystem::resize_file(marker, std::filesystem::file_size(marker) / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto m = testing::OpenAgreed(dir + "/shared");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(RestoreLatest(**m), 0);
}

// Errors that are not about a step's bytes are returned, not skipped over.
TEST(Fallback, RequestErrorsAreReturnedNotSkipped) {
  const std::string dir = FreshDir();
  auto m = testing::OpenAgreed(dir + "/shared");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Target t(Size(), Rank());
  Result<int64_t> none = (*m)->RestoreLatest(t.arrays);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
  for (int64_t step = 0; step < 2; ++step) {
    Step s(step, Rank(), Size());
    ASSERT_TRUE((*m)->Save(step, s.arrays).ok());
  }
  ASSERT_TRUE((*m)->WaitUntilFinished().ok());
  // A dtype the steps do not hold, on the last rank only.
  if (Rank() == Size() - 1) t.arrays[0].dtype = DType::kInt32;
  Result<int64_t> bad = (*m)->RestoreLatest(t.arrays);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  EXPECT_TRUE(SameOnAllRanks(bad.status()));
  // An array no step holds.
  Target u(Size(), Rank());
  u.arrays[1].name = "nope";
  Result<int64_t> missing = (*m)->RestoreLatest(u.arrays);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  EXPECT_EQ(RestoreLatest(**m), 1);
}

// (e) Parity instead of copies: rank 0's file damaged on its node (its only
// copy) is rebuilt from its parity group, bit for bit; with a parity block
// damaged too, the step is an agreed DataLoss and RestoreLatest falls back.
TEST(FallbackParity, ADamagedPieceIsRebuiltFromParity) {
  REQUIRE_NODES();
  const std::string dir = FreshDir();
  SaveSteps(Open(dir, 2, NodeCount(Size())), 2);  // 0: both tiers; 1: local only
  ASSERT_EQ(DamageLocal(dir, 1, 0), 1);           // no copies: node 0's own file only
  auto m = Open(dir, 2, NodeCount(Size()));
  ASSERT_TRUE(m);
  for (int parts : {Size(), 1}) {
    Target t(parts, parts == 1 ? 0 : Rank());
    Status s = RestoreLocal(*m, 1, t);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(SameOnAllRanks(s));
    EXPECT_TRUE(t.Holds(1)) << "at " << parts << " parts";
  }
  EXPECT_EQ(RestoreLatest(*m), 1);

  // Every parity block of rank 0's group damaged as well: no source is left.
  MPI_Barrier(MPI_COMM_WORLD);
  if (Rank() == 0) {
    for (int n = 0; n < NodeCount(Size()); ++n) {
      for (const auto& e : std::filesystem::directory_iterator(
               fmt::format("{}/node{}/{}", dir, n, io::StepDirName(1)))) {
        const std::string name = e.path().filename().string();
        if (name.rfind("p", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin" &&
            e.file_size() > 12) {
          FlipTwoBytes(e.path().string(), 1);
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Target t(Size(), Rank());
  Status s = RestoreLocal(*m, 1, t);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_NE(s.message().find("parity"), std::string::npos) << s.ToString();
  EXPECT_EQ(RestoreLatest(*m), 0);
}

}  // namespace
}  // namespace mhckpt::tiers_test
