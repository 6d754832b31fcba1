// Bad input: the same clear Status on every rank, nothing committed, no hang,
// and the next save still works.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "coordinator/checkpoint_manager.h"
#include "io/layout.h"
#include "tests/test_util.h"
#include "worker/copy.h"

namespace mhckpt {
namespace {

using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;
using testing::SameOnAllRanks;
using testing::Size;

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir();
    mgr_ = OpenForTest(dir_);
    ASSERT_TRUE(mgr_);
    buf_.resize(1 << 16);
    for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = static_cast<float>(i);
  }

  // A valid array: `rows` x 4 float32 split by rows over the ranks; element
  // (i, j) holds the value 4 i + j.
  ArrayToSave Rows(const std::string& name, int64_t rows = 10) {
    auto [b, e] = SplitRange(rows, Size(), Rank());
    return ArrayToSave{
        name, DType::kFloat32, {rows, 4}, {Shard{Box{{b, 0}, {e - b, 4}}, buf_.data() + b * 4}}};
  }

  // Saves, waits, and checks that every rank got the same error of `code`
  // mentioning `text`, and that nothing was committed.
  void ExpectSaveFails(int64_t step, const std::vector<ArrayToSave>& arrays, StatusCode code,
                       const std::string& text) {
    mgr_->Save(step, arrays).IgnoreError();
    Status s = mgr_->WaitUntilFinished();
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(text));
    EXPECT_TRUE(SameOnAllRanks(s)) << "rank " << Rank() << ": " << s.ToString();
    EXPECT_FALSE(std::filesystem::exists(io::MarkerPath(dir_, step)));
    ExpectNextSaveWorks(step);
  }

  void ExpectRestoreFails(int64_t step, const std::vector<ArrayToRestore>& arrays, StatusCode code,
                          const std::string& text, RestoreOptions o = {}) {
    Status s = mgr_->Restore(step, arrays, o);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(text));
    EXPECT_TRUE(SameOnAllRanks(s)) << "rank " << Rank() << ": " << s.ToString();
  }

  void ExpectNextSaveWorks(int64_t step) {
    std::vector<ArrayToSave> ok{Rows("fine")};
    ASSERT_TRUE(mgr_->Save(step, ok).ok());
    Status s = mgr_->WaitUntilFinished();
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::filesystem::exists(io::MarkerPath(dir_, step)));
  }

  int Last() const { return Size() - 1; }

  std::string dir_;
  std::unique_ptr<CheckpointManager> mgr_;
  std::vector<float> buf_;
};

TEST_F(Validation, DTypeDisagreesAcrossRanks) {
  auto a = Rows("w");
  if (Rank() == Last()) a.dtype = DType::kFloat64;
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument,
                  "array 'w': rank " + std::to_string(Last()) + " says float64");
}

TEST_F(Validation, ShapeDisagreesAcrossRanks) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  auto a = Rows("w");
  if (Rank() == Last()) a.shape = {10, 5};
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument, "[10, 5]");
}

TEST_F(Validation, BoxOutOfBoundsNamesArrayRankAndBox) {
  auto a = Rows("w");
  if (Rank() == Last()) a.shards[0].box = Box{{8, 0}, {3, 4}};
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument,
                  "array 'w' on rank " + std::to_string(Last()) + ", box [8:11, 0:4]");
}

TEST_F(Validation, NullDataAndWrongBoxRank) {
  auto a = Rows("w");
  if (Rank() == 0) a.shards[0].data = nullptr;
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument, "rank 0, box");
  auto b = Rows("w");
  if (Rank() == Last()) b.shards[0].box = Box{{0}, {1}};
  ExpectSaveFails(2, {b}, StatusCode::kInvalidArgument, "for a 2-d array");
}

TEST_F(Validation, PartialOverlap) {
  auto a = Rows("w");
  // Every rank also claims rows [0, 2) plus one of its neighbour's rows.
  a.shards.push_back(Shard{Box{{1, 0}, {2, 4}}, buf_.data()});
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument, "overlap partially");
}

TEST_F(Validation, HolesInCoverage) {
  auto a = Rows("w", 2 * Size());  // every rank holds rows (10 rows leave ranks 10-15 none)
  if (Rank() == Last()) a.shards.clear();
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument, "holes");
}

TEST_F(Validation, DuplicateNames) {
  ExpectSaveFails(1, {Rows("w"), Rows("w")}, StatusCode::kInvalidArgument, "duplicate name");
}

TEST_F(Validation, UnsafeNames) {
  int64_t step = 10;
  for (std::string name : {"../escape", "a//b", "/abs", "", "a/./b"}) {
    ExpectSaveFails(step++, {Rows(name)}, StatusCode::kInvalidArgument, "bad name");
  }
}

TEST_F(Validation, ArrayIsAlsoAGroup) {
  ExpectSaveFails(1, {Rows("a"), Rows("a/b")}, StatusCode::kInvalidArgument,
                  "cannot be both an array and a group");
}

TEST_F(Validation, ArrayMissingOnOneRank) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  std::vector<ArrayToSave> arrays{Rows("w"), Rows("v", Size())};
  if (Rank() == Last()) arrays.pop_back();
  ExpectSaveFails(1, arrays, StatusCode::kInvalidArgument,
                  "array 'v' is saved by rank 0 but not by rank " + std::to_string(Last()));
}

TEST_F(Validation, RanksDisagreeOnStep) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  mgr_->Save(Rank() == Last() ? 8 : 7, std::vector<ArrayToSave>{Rows("w")}).IgnoreError();
  Status s = mgr_->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ranks disagree on the step"));
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_TRUE(mgr_->CommittedSteps().value().empty());
}

TEST_F(Validation, RanksDisagreeOnStepWhenThePlanIsCached) {
  if (Size() == 1) GTEST_SKIP() << "needs two ranks";
  ExpectNextSaveWorks(1);
  ExpectNextSaveWorks(2);  // the plan of "fine" is now cached
  mgr_->Save(Rank() == Last() ? 4 : 3, std::vector<ArrayToSave>{Rows("fine")}).IgnoreError();
  Status s = mgr_->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("ranks disagree on the step"));
  EXPECT_TRUE(SameOnAllRanks(s));
  EXPECT_EQ(mgr_->CommittedSteps().value(), (std::vector<int64_t>{1, 2}));
}

TEST_F(Validation, DeviceMemoryWithoutADevice) {
  if (internal::CudaAvailable())
    GTEST_SKIP() << "a CUDA device is present (tests/gpu_test.cc covers it)";
  auto a = Rows("w", 2 * Size());  // the last rank's box is not empty
  if (Rank() == Last()) a.shards[0].memory = Memory::kCuda;
  ExpectSaveFails(1, {a}, StatusCode::kInvalidArgument, "device memory, but no CUDA device");
}

TEST_F(Validation, StepAlreadyCommitted) {
  ExpectNextSaveWorks(4);
  mgr_->Save(4, std::vector<ArrayToSave>{Rows("w")}).IgnoreError();
  Status s = mgr_->WaitUntilFinished();
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_TRUE(SameOnAllRanks(s));
}

TEST_F(Validation, RestoreErrors) {
  ExpectNextSaveWorks(1);  // array "fine", shape [10, 4], float32
  std::vector<float> out(64);
  auto full = [&](std::string name, DType t, Box box) {
    return ArrayToRestore{std::move(name), t, {Destination{std::move(box), out.data()}}};
  };
  ExpectRestoreFails(9, {}, StatusCode::kNotFound, "step 9 is not committed");
  // Only the last rank asks for a bad thing; every rank must report it.
  auto bad = [&](ArrayToRestore r) {
    return Rank() == Last() ? std::vector<ArrayToRestore>{r} : std::vector<ArrayToRestore>{};
  };
  ExpectRestoreFails(1, bad(full("nope", DType::kFloat32, Box{{0, 0}, {1, 4}})),
                     StatusCode::kNotFound, "array 'nope'");
  ExpectRestoreFails(1, bad(full("fine", DType::kFloat32, Box{{9, 0}, {2, 4}})),
                     StatusCode::kInvalidArgument,
                     "array 'fine' on rank " + std::to_string(Last()) + ", box [9:11, 0:4]");
  ExpectRestoreFails(1, bad(full("fine", DType::kInt32, Box{{0, 0}, {1, 4}})),
                     StatusCode::kInvalidArgument, "requested as int32, stored as float32");
  ExpectRestoreFails(1, {}, StatusCode::kInvalidArgument, "strict restore: array 'fine'",
                     RestoreOptions{.strict = true});
  // And a good restore afterwards: all 40 values in place, nothing past them.
  std::vector<ArrayToRestore> good{full("fine", DType::kFloat32, Box{{0, 0}, {10, 4}})};
  out.assign(64, -1.0f);
  ASSERT_TRUE(mgr_->Restore(1, good, RestoreOptions{.strict = true}).ok());
  std::vector<float> expected(64, -1.0f);
  for (size_t i = 0; i < 40; ++i) expected[i] = static_cast<float>(i);
  EXPECT_EQ(out, expected);
}

// Agree (for checks made above the C++ API, e.g. in Python): the lowest
// failing rank's error on every rank, OK when no rank failed, and the
// manager keeps working after it, beside a pending save.
TEST_F(Validation, AgreeGivesTheLowestFailingRanksError) {
  EXPECT_TRUE(mgr_->Agree(OkStatus()).ok());
  int last = Size() - 1;
  Status local = Rank() >= last ? InvalidArgument("rank " + std::to_string(Rank()) + ": bad leaf")
                                : OkStatus();
  Status s = mgr_->Agree(local);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank " + std::to_string(last) + ": bad leaf"));
  EXPECT_TRUE(SameOnAllRanks(s)) << "rank " << Rank() << ": " << s.ToString();
  std::vector<ArrayToSave> arrays = {Rows("w")};
  ASSERT_TRUE(mgr_->Save(1, arrays).ok());
  EXPECT_TRUE(mgr_->Agree(OkStatus()).ok());  // on the caller's thread, beside the I/O thread
  EXPECT_TRUE(mgr_->WaitUntilFinished().ok());
}

}  // namespace
}  // namespace mhckpt
