// Save and restore at one world size: every dtype, replicas, scalars,
// zero-length arrays, subsets, synchronous mode, buffers freed after Save.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "coordinator/checkpoint_manager.h"
#include "io/catalog.h"
#include "io/layout.h"
#include "io/marker.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

// Owns the buffers behind an ArrayToSave.
struct Saved {
  ArrayToSave array;
  std::vector<std::vector<std::byte>> buffers;
  void Add(const Box& box, uint64_t seed) {
    buffers.push_back(Fill(array.dtype, array.shape, box, seed));
    array.shards.push_back(Shard{box, buffers.back().data()});
  }
};

// Owns the buffers behind an ArrayToRestore and checks them.
struct Wanted {
  ArrayToRestore array;
  std::vector<int64_t> shape;
  std::vector<std::vector<std::byte>> buffers;
  void Add(const Box& box) {
    buffers.emplace_back(static_cast<size_t>(Volume(box.count).value()) * DTypeSize(array.dtype),
                         std::byte{0xAB});
    array.shards.push_back(Destination{box, buffers.back().data()});
  }
  void Expect(uint64_t seed) const {
    for (size_t i = 0; i < buffers.size(); ++i) {
      auto want = Fill(array.dtype, shape, array.shards[i].box, seed);
      EXPECT_TRUE(want == buffers[i]) << "array " << array.name << " box "
                                      << BoxToString(array.shards[i].box) << " on rank " << Rank();
    }
  }
};

// Rows of `shape` owned by `part` of `parts` (all columns).
Box RowBox(const std::vector<int64_t>& shape, int parts, int part) {
  auto [b, e] = SplitRange(shape[0], parts, part);
  Box box = FullBox(shape);
  box.start[0] = b;
  box.count[0] = e - b;
  return box;
}

TEST(SaveRestore, EveryDTypeRoundTripsBitExactAcrossShardings) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  std::vector<Saved> saved;
  for (int t = 0; t < kNumDTypes; ++t) {
    Saved s;
    s.array = ArrayToSave{"dtypes/" + std::string(DTypeName(static_cast<DType>(t))),
                          static_cast<DType>(t),
                          {13, 5},
                          {}};
    s.Add(RowBox(s.array.shape, p, r), 100 + t);
    saved.push_back(std::move(s));
  }
  std::vector<ArrayToSave> arrays;
  for (auto& s : saved) arrays.push_back(s.array);
  ASSERT_TRUE(mgr->Save(3, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(mgr->LatestStep().value(), std::optional<int64_t>(3));

  // Restore by columns instead of rows; rank order reversed.
  std::vector<Wanted> wanted;
  for (int t = 0; t < kNumDTypes; ++t) {
    Wanted w{{saved[t].array.name, saved[t].array.dtype, {}}, {13, 5}, {}};
    auto [b, e] = SplitRange(5, p, p - 1 - r);
    w.Add(Box{{0, b}, {13, e - b}});
    wanted.push_back(std::move(w));
  }
  std::vector<ArrayToRestore> req;
  for (auto& w : wanted) req.push_back(w.array);
  s = mgr->Restore(3, req);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int t = 0; t < kNumDTypes; ++t) wanted[t].Expect(100 + t);
}

TEST(SaveRestore, ReplicatedScalarsAndZeroLengthArrays) {
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  std::vector<Saved> saved(4);
  saved[0].array = {"step", DType::kInt64, {}, {}};
  saved[0].Add(Box{}, 1);  // every rank holds the scalar: a replica
  saved[1].array = {"norm/scale", DType::kFloat32, {3}, {}};
  saved[1].Add(FullBox({3}), 2);
  saved[2].array = {"empty", DType::kFloat64, {0, 4}, {}};
  saved[2].Add(Box{{0, 0}, {0, 4}}, 3);
  saved[3].array = {"nothing_held", DType::kInt32, {5, 0}, {}};  // no boxes at all
  std::vector<ArrayToSave> arrays;
  for (auto& s : saved) arrays.push_back(s.array);
  ASSERT_TRUE(mgr->Save(1, arrays, {{"note", "hello"}}).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();

  auto marker = mgr->Describe(1);
  ASSERT_TRUE(marker.ok()) << marker.status().ToString();
  EXPECT_EQ(mgr->Describe(2).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(marker->world_size, Size());
  EXPECT_EQ(marker->user_metadata.at("note"), "hello");
  const StoredArray* step = marker->Find("step");
  ASSERT_NE(step, nullptr);
  EXPECT_TRUE(step->replicated);
  ASSERT_EQ(step->boxes.size(), 1u);
  EXPECT_EQ(step->boxes[0].writer, 0);  // replicated arrays: rank 0 writes
  EXPECT_TRUE(marker->Find("norm/scale")->replicated);
  EXPECT_TRUE(marker->Find("empty")->boxes.empty());

  std::vector<Wanted> wanted(3);
  wanted[0] = {{"step", DType::kInt64, {}}, {}, {}};
  wanted[0].Add(Box{});
  wanted[1] = {{"norm/scale", DType::kFloat32, {}}, {3}, {}};
  wanted[1].Add(FullBox({3}));
  wanted[2] = {{"empty", DType::kFloat64, {}}, {0, 4}, {}};
  wanted[2].Add(Box{{0, 0}, {0, 4}});
  std::vector<ArrayToRestore> req;
  for (auto& w : wanted) req.push_back(w.array);
  s = mgr->Restore(1, req);
  ASSERT_TRUE(s.ok()) << s.ToString();
  wanted[0].Expect(1);
  wanted[1].Expect(2);
}

TEST(SaveRestore, DataParallelReplicasOfModelParallelShardsAreWrittenOnce) {
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const int mp = p >= 2 ? 2 : 1;  // model-parallel degree; the rest is data-parallel
  const std::vector<int64_t> shape{100, 6};
  std::vector<Saved> saved(3);
  for (int a = 0; a < 3; ++a) {
    saved[a].array = {"layers/" + std::to_string(a) + "/w", DType::kFloat32, shape, {}};
    saved[a].Add(RowBox(shape, mp, r % mp), 10 + a);
  }
  std::vector<ArrayToSave> arrays;
  for (auto& s : saved) arrays.push_back(s.array);
  ASSERT_TRUE(mgr->Save(5, arrays).ok());
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Each distinct box is in the marker once, with a writer that holds it.
  auto marker = io::ReadMarker(io::MarkerPath(dir, 5));
  ASSERT_TRUE(marker.ok());
  for (const auto& a : marker->arrays) {
    ASSERT_EQ(a.boxes.size(), static_cast<size_t>(mp));
    for (int k = 0; k < mp; ++k) EXPECT_EQ(a.boxes[k].writer % mp, k);
  }
  // The bytes written over all ranks are exactly the array bytes: no box twice.
  uint64_t written = testing::SumOverRanks(mgr->LastSaveTimings().written_bytes);
  EXPECT_EQ(written, 3u * 100 * 6 * 4);
  EXPECT_EQ(marker->total_bytes, 3u * 100 * 6 * 4);

  std::vector<Wanted> wanted(3);
  std::vector<ArrayToRestore> req;
  for (int a = 0; a < 3; ++a) {
    wanted[a] = {{saved[a].array.name, DType::kFloat32, {}}, shape, {}};
    wanted[a].Add(FullBox(shape));
    req.push_back(wanted[a].array);
  }
  s = mgr->Restore(5, req);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int a = 0; a < 3; ++a) wanted[a].Expect(10 + a);
}

TEST(SaveRestore, SeveralBoxesPerRankAndSubsetRestore) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  // 2p column blocks; rank r holds blocks r and 2p-1-r.
  const std::vector<int64_t> shape{7, 8 * p};
  Saved a{{"a", DType::kUInt16, shape, {}}, {}};
  a.Add(Box{{0, 4 * r}, {7, 4}}, 7);
  a.Add(Box{{0, 4 * (2 * p - 1 - r)}, {7, 4}}, 7);
  Saved b{{"b", DType::kInt8, {9}, {}}, {}};
  b.Add(RowBox({9}, p, r), 8);
  std::vector<ArrayToSave> arrays{a.array, b.array};
  ASSERT_TRUE(mgr->Save(2, arrays).ok());
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());

  // Only "a", as two row halves on every rank.
  Wanted w{{"a", DType::kUInt16, {}}, shape, {}};
  w.Add(Box{{0, 0}, {3, 8 * p}});
  w.Add(Box{{3, 0}, {4, 8 * p}});
  Status s = mgr->Restore(2, std::vector<ArrayToRestore>{w.array});
  ASSERT_TRUE(s.ok()) << s.ToString();
  w.Expect(7);
}

TEST(SaveRestore, BuffersMayBeOverwrittenAndFreedRightAfterSave) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  ASSERT_TRUE(mgr->async()) << "the tests run with MPI_THREAD_MULTIPLE";
  const int p = Size(), r = Rank();
  const std::vector<int64_t> shape{4096, 16};
  for (int step = 0; step < 3; ++step) {
    auto saved = std::make_unique<Saved>();
    saved->array = {"w", DType::kFloat32, shape, {}};
    saved->Add(RowBox(shape, p, r), 50 + step);
    auto rep = std::make_unique<Saved>();
    rep->array = {"rng", DType::kUInt64, {4}, {}};
    rep->Add(FullBox({4}), 60 + step);
    std::vector<ArrayToSave> arrays{saved->array, rep->array};
    ASSERT_TRUE(mgr->Save(step, arrays).ok());
    // The training loop reuses and frees its buffers at once.
    for (auto& buf : saved->buffers) std::memset(buf.data(), 0xFF, buf.size());
    for (auto& buf : rep->buffers) std::memset(buf.data(), 0xFF, buf.size());
    saved.reset();
    rep.reset();
  }
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{0, 1, 2}));
  for (int step = 0; step < 3; ++step) {
    Wanted w{{"w", DType::kFloat32, {}}, shape, {}};
    w.Add(RowBox(shape, p, (r + 1) % p));
    Wanted g{{"rng", DType::kUInt64, {}}, {4}, {}};
    g.Add(FullBox({4}));
    ASSERT_TRUE(mgr->Restore(step, std::vector<ArrayToRestore>{w.array, g.array}).ok());
    w.Expect(50 + step);
    g.Expect(60 + step);
  }
}

TEST(SaveRestore, SynchronousModeAndCollectiveTransfer) {
  Options o;
  o.async = false;
  o.transfer = Transfer::kCollective;
  auto mgr = OpenForTest(FreshDir(), o);
  ASSERT_TRUE(mgr);
  EXPECT_FALSE(mgr->async());
  const int p = Size(), r = Rank();
  // Rank 0 holds two boxes, others one: collective calls must still match.
  const std::vector<int64_t> shape{2 * p + 1, 3};
  Saved a{{"x", DType::kFloat64, shape, {}}, {}};
  a.Add(Box{{2 * r, 0}, {2, 3}}, 9);
  if (r == 0) a.Add(Box{{2 * p, 0}, {1, 3}}, 9);
  ASSERT_TRUE(mgr->Save(0, std::vector<ArrayToSave>{a.array}).ok());
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  Wanted w{{"x", DType::kFloat64, {}}, shape, {}};
  w.Add(FullBox(shape));
  ASSERT_TRUE(mgr->Restore(0, std::vector<ArrayToRestore>{w.array}).ok());
  w.Expect(9);
}

TEST(SaveRestore, UncommittedStepsAreIgnoredAndRemovedOnOpen) {
  const std::string dir = FreshDir();
  {
    auto mgr = OpenForTest(dir);
    ASSERT_TRUE(mgr);
    Saved a{{"x", DType::kInt32, {4}, {}}, {}};
    if (Rank() == 0) a.Add(FullBox({4}), 1);
    ASSERT_TRUE(mgr->Save(1, std::vector<ArrayToSave>{a.array}).ok());
    ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  }
  if (Rank() == 0) {
    // A crashed save: data written, no marker; and one with a half-written temp marker.
    std::filesystem::create_directories(io::StepDir(dir, 2));
    std::ofstream(io::DataPath(dir, 2)) << "partial";
    std::filesystem::create_directories(io::StepDir(dir, 3));
    std::ofstream(io::MarkerPath(dir, 3) + ".tmp") << "{";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto mgr = OpenForTest(dir);
  ASSERT_TRUE(mgr);
  EXPECT_EQ(mgr->CommittedSteps().value(), std::vector<int64_t>{1});
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 2)));
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 3)));
  EXPECT_TRUE(std::filesystem::exists(io::StepDir(dir, 1)));
  Status s = mgr->Restore(2, std::vector<ArrayToRestore>{});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
}

TEST(SaveRestore, BackToBackSavesCommitInOrderWithinOneCopyOfStaging) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const std::vector<int64_t> shape{2048 * p, 256};  // 2 MiB of float32 per rank
  std::vector<std::unique_ptr<Saved>> kept;
  for (int step = 0; step < 5; ++step) {
    auto a = std::make_unique<Saved>();
    a->array = {"w", DType::kFloat32, shape, {}};
    a->Add(RowBox(shape, p, r), 200 + step);
    ASSERT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{a->array}).ok());
    EXPECT_LE(mgr->StagingBytes(), size_t{2} << 20) << "more than one staged copy";
  }
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  for (int step = 0; step < 5; ++step) {
    Wanted w{{"w", DType::kFloat32, {}}, shape, {}};
    w.Add(RowBox(shape, p, p - 1 - r));
    ASSERT_TRUE(mgr->Restore(step, std::vector<ArrayToRestore>{w.array}).ok());
    w.Expect(200 + step);
  }
}

TEST(SaveRestore, UnchangedArraysReuseThePlan) {
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  const int p = Size(), r = Rank();
  const std::vector<int64_t> shape{10 * p, 3};
  auto save = [&](int64_t step, int parts) {
    Saved a{{"w", DType::kFloat32, shape, {}}, {}};
    // `parts` pieces per rank: changing it changes the boxes, not the array.
    for (int k = 0; k < parts; ++k) a.Add(RowBox(shape, p * parts, r * parts + k), step);
    EXPECT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{a.array}).ok());
    EXPECT_TRUE(mgr->WaitUntilFinished().ok());
    Wanted w{{"w", DType::kFloat32, {}}, shape, {}};
    w.Add(FullBox(shape));
    EXPECT_TRUE(mgr->Restore(step, std::vector<ArrayToRestore>{w.array}).ok());
    w.Expect(step);
    return mgr->LastSaveTimings().plan_cached;
  };
  EXPECT_FALSE(save(1, 1));
  EXPECT_TRUE(save(2, 1));
  EXPECT_TRUE(save(3, 1));
  EXPECT_FALSE(save(4, 2));  // other boxes: a full plan round
  EXPECT_TRUE(save(5, 2));
  // A cached plan still refuses a committed step.
  Saved a{{"w", DType::kFloat32, shape, {}}, {}};
  a.Add(RowBox(shape, p * 2, r * 2), 5);
  a.Add(RowBox(shape, p * 2, r * 2 + 1), 5);
  ASSERT_TRUE(mgr->Save(5, std::vector<ArrayToSave>{a.array}).ok());
  EXPECT_EQ(mgr->WaitUntilFinished().code(), StatusCode::kAlreadyExists);
}

TEST(SaveRestore, RetentionKeepsNewestAndEveryKthStep) {
  const std::string dir = FreshDir();
  Options o;
  o.max_to_keep = 2;
  o.keep_period = 3;
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  for (int step = 0; step <= 7; ++step) {
    Saved a{{"x", DType::kInt32, {4}, {}}, {}};
    a.Add(FullBox({4}), step);
    ASSERT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{a.array}).ok());
  }
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  // Retention runs on rank 0 after each commit is announced; rank 0's listing
  // waits for it, and the agreement makes every rank look after that.
  ASSERT_TRUE(mgr->CommittedSteps().ok());
  ASSERT_TRUE(mgr->Agree(OkStatus()).ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{0, 3, 6, 7}));
  EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, 5)));
  Wanted w{{"x", DType::kInt32, {}}, {4}, {}};
  w.Add(FullBox({4}));
  ASSERT_TRUE(mgr->Restore(3, std::vector<ArrayToRestore>{w.array}).ok());
  w.Expect(3);
}

// keep_best: max_to_keep keeps the best steps by a metric in their
// metadata (lower is better here), the newest included only if it is among
// them; steps without the metric are kept.
TEST(SaveRestore, RetentionKeepsTheBestStepsByAMetric) {
  const std::string dir = FreshDir();
  Options o;
  o.max_to_keep = 2;
  o.keep_best = {"loss", /*maximize=*/false, /*keep_without_metric=*/true};
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  const char* loss[] = {"0.9", "0.2", "0.5", "0.3", "0.8", ""};
  for (int step = 1; step <= 6; ++step) {
    Saved a{{"x", DType::kInt32, {4}, {}}, {}};
    a.Add(FullBox({4}), step);
    UserMetadata m;
    if (*loss[step - 1] != '\0') m["loss"] = loss[step - 1];
    ASSERT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{a.array}, m).ok());
  }
  ASSERT_TRUE(mgr->WaitUntilFinished().ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{2, 4, 6}));
  Wanted w{{"x", DType::kInt32, {}}, {4}, {}};
  w.Add(FullBox({4}));
  ASSERT_TRUE(mgr->Restore(2, std::vector<ArrayToRestore>{w.array}).ok());
  w.Expect(2);
}

// Delete: after the saves in flight, the step is gone on every rank (no
// marker, not listed), the others restore as saved, a missing step is
// NotFound on every rank, and a step number deleted may be saved again.
TEST(SaveRestore, DeleteRemovesOneCommittedStepEverywhere) {
  const std::string dir = FreshDir();
  auto mgr = OpenForTest(dir, Options{});
  ASSERT_TRUE(mgr);
  std::vector<Saved> saved;
  for (int step = 1; step <= 3; ++step) {
    Saved a{{"x", DType::kFloat64, {4 * Size(), 3}, {}}, {}};
    a.Add(RowBox({4 * Size(), 3}, Size(), Rank()), 10 + step);
    saved.push_back(a);
    ASSERT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{saved.back().array}).ok());
  }
  // No WaitUntilFinished: Delete waits for step 2's commit itself.
  ASSERT_TRUE(mgr->Delete(2).ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir, 2)));
  Status missing = mgr->Delete(2);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  EXPECT_TRUE(SameOnAllRanks(missing));
  for (int step : {1, 3}) {
    Wanted w{{"x", DType::kFloat64, {}}, {4 * Size(), 3}, {}};
    w.Add(FullBox({4 * Size(), 3}));
    ASSERT_TRUE(mgr->Restore(step, std::vector<ArrayToRestore>{w.array}).ok());
    // Every rank's rows: each was filled from the same seed and the full shape.
    w.Expect(10 + step);
  }
  Saved again{{"x", DType::kFloat64, {4 * Size(), 3}, {}}, {}};
  again.Add(RowBox({4 * Size(), 3}, Size(), Rank()), 99);
  ASSERT_TRUE(mgr->Save(2, std::vector<ArrayToSave>{again.array}).ok());
  ASSERT_TRUE(mgr->Delete(3).ok());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{1, 2}));
  Wanted w{{"x", DType::kFloat64, {}}, {4 * Size(), 3}, {}};
  w.Add(FullBox({4 * Size(), 3}));
  ASSERT_TRUE(mgr->Restore(2, std::vector<ArrayToRestore>{w.array}).ok());
  w.Expect(99);
}

// Retention retires old steps at once (marker, then a rename out of the
// listing) and removes their files in the background: after
// WaitUntilFinished the old steps are neither listed nor under their step
// directory's name; once the manager is gone (its deleter drained), nothing
// of them is left. A retired directory left behind by a previous job is
// removed by the next Open.
TEST(SaveRestore, RetiredStepsAreRemovedInTheBackgroundAndAtOpen) {
  const std::string dir = FreshDir();
  Options o;
  o.max_to_keep = 1;
  {
    auto mgr = OpenForTest(dir, o);
    ASSERT_TRUE(mgr);
    for (int step = 1; step <= 4; ++step) {
      Saved a{{"x", DType::kInt32, {4}, {}}, {}};
      a.Add(FullBox({4}), step);
      ASSERT_TRUE(mgr->Save(step, std::vector<ArrayToSave>{a.array}).ok());
      ASSERT_TRUE(mgr->WaitUntilFinished().ok());
      EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{step}));
      for (int old = 1; old < step; ++old) {
        EXPECT_FALSE(std::filesystem::exists(io::StepDir(dir, old))) << "step " << old;
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every manager closed: rank 0's deleter has finished
  EXPECT_TRUE(io::RetiredDirs(dir).value().empty());
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has looked

  // A previous job's leftover: a retired directory with a file in it.
  if (Rank() == 0) {
    const std::string left = dir + "/" + std::string(io::kRetiredPrefix) + "step_0000000002.1.0";
    std::filesystem::create_directories(left);
    std::ofstream(left + "/data.h5") << "old bytes";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto mgr = OpenForTest(dir, o);
  ASSERT_TRUE(mgr);
  EXPECT_TRUE(io::RetiredDirs(dir).value().empty());
  EXPECT_EQ(mgr->CommittedSteps().value(), (std::vector<int64_t>{4}));
}

}  // namespace
}  // namespace mhckpt
