// coordinator/plan.h: validation of every rank's description, writer choice,
// replica-parallel slices.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coordinator/plan.h"
#include "io/marker.h"

namespace mhckpt::internal {
namespace {

using ::testing::HasSubstr;

RankDescription Holder(int64_t step, std::vector<std::pair<std::string, std::vector<Box>>> arrays,
                       std::vector<int64_t> shape = {8}) {
  RankDescription d;
  d.step = step;
  for (auto& [name, boxes] : arrays) d.arrays.push_back({name, DType::kFloat32, shape, boxes});
  return d;
}

TEST(Plan, OneWriterPerDistinctBoxSpreadOverHolders) {
  // Two model-parallel halves, each held by two data-parallel ranks.
  Box lo{{0}, {4}}, hi{{4}, {4}};
  std::vector<RankDescription> ranks = {
      Holder(1, {{"x", {lo}}, {"y", {lo}}}), Holder(1, {{"x", {hi}}, {"y", {hi}}}),
      Holder(1, {{"x", {lo}}, {"y", {lo}}}), Holder(1, {{"x", {hi}}, {"y", {hi}}})};
  auto plan = BuildPlan(ranks);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->arrays.size(), 2u);
  EXPECT_EQ(plan->arrays[0].boxes[0].writer, 0);  // x lo: ranks 0, 2
  EXPECT_EQ(plan->arrays[0].boxes[1].writer, 1);  // x hi: ranks 1, 3
  EXPECT_EQ(plan->arrays[1].boxes[0].writer, 2);  // y lo goes to the less loaded holder
  EXPECT_EQ(plan->arrays[1].boxes[1].writer, 3);
  EXPECT_EQ(plan->total_bytes, 2u * 8 * 4);
  EXPECT_EQ(BuildPlan(ranks).value().arrays[1].boxes[0].writer, 2);  // deterministic
}

TEST(Plan, ReplicatedArraysAreWrittenByRankZero) {
  Box all{{0}, {8}};
  auto plan = BuildPlan({Holder(1, {{"r", {all}}}), Holder(1, {{"r", {all}}})});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->arrays[0].replicated);
  EXPECT_EQ(plan->arrays[0].boxes[0].writer, 0);
}

// (start[0], count[0], writer) of each planned box of array `i`.
std::vector<std::tuple<int64_t, int64_t, int>> Rows(const io::Marker& plan, size_t i) {
  std::vector<std::tuple<int64_t, int64_t, int>> out;
  for (const io::MarkerBox& b : plan.arrays[i].boxes) {
    out.emplace_back(b.box.start.at(0), b.box.count.at(0), b.writer);
  }
  return out;
}

TEST(Plan, SplitRowsNearEqualInOrder) {
  Box b{{10, 0}, {7, 3}};
  std::vector<Box> s = SplitRows(b, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (Box{{10, 0}, {3, 3}}));
  EXPECT_EQ(s[1], (Box{{13, 0}, {2, 3}}));
  EXPECT_EQ(s[2], (Box{{15, 0}, {2, 3}}));
  EXPECT_EQ(SplitRows(b, 1), std::vector<Box>{b});
  EXPECT_EQ(SplitRows(Box{{0}, {2}}, 4).size(), 2u);  // at most one slice per row
  EXPECT_EQ(SplitRows(Box{{0}, {1}}, 4), (std::vector<Box>{Box{{0}, {1}}}));
  EXPECT_EQ(SplitRows(Box{}, 4), std::vector<Box>{Box{}});  // a scalar stays whole
}

TEST(Plan, ReplicaParallelSplitsBigReplicatedBoxesAmongHolders) {
  // Shape {8} float32: 32 bytes. Three holders of the whole array.
  Box all{{0}, {8}};
  std::vector<RankDescription> ranks = {Holder(1, {{"r", {all}}, {"s", {all}}}),
                                        Holder(1, {{"r", {all}}, {"s", {all}}}),
                                        Holder(1, {{"r", {all}}, {"s", {all}}})};
  auto plan = BuildPlan(ranks, 8);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  using R = std::vector<std::tuple<int64_t, int64_t, int>>;
  EXPECT_EQ(Rows(*plan, 0), (R{{0, 3, 0}, {3, 3, 1}, {6, 2, 2}}));
  EXPECT_TRUE(plan->arrays[0].replicated);  // every holder had the whole array
  EXPECT_EQ(plan->total_bytes, 2u * 32);    // each byte counted once
  // Identical on every call (every rank follows rank 0's plan; cached plans too).
  EXPECT_EQ(MarkerToJson(*plan), MarkerToJson(BuildPlan(ranks, 8).value()));
  // No slice under the threshold unless that leaves fewer than 2: 2 slices
  // of 16 bytes, to the 2 least loaded holders (for "s": ranks 2, then 0).
  auto halves = BuildPlan(ranks, 32);
  ASSERT_TRUE(halves.ok());
  EXPECT_EQ(Rows(*halves, 0), (R{{0, 4, 0}, {4, 4, 1}}));
  EXPECT_EQ(Rows(*halves, 1), (R{{0, 4, 0}, {4, 4, 2}}));
  // Under the threshold, or off: one box, written by rank 0.
  for (uint64_t threshold : {uint64_t{0}, uint64_t{33}}) {
    auto whole = BuildPlan(ranks, threshold);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(Rows(*whole, 0), (R{{0, 8, 0}})) << threshold;
  }
  // A box held by one rank is never split.
  auto single = BuildPlan({Holder(1, {{"r", {all}}})}, 1);
  EXPECT_EQ(Rows(single.value(), 0), (R{{0, 8, 0}}));
  // Fewer rows than holders: one row each, to the first holders.
  auto short_rows =
      BuildPlan({Holder(1, {{"r", {Box{{0}, {2}}}}}, {2}), Holder(1, {{"r", {Box{{0}, {2}}}}}, {2}),
                 Holder(1, {{"r", {Box{{0}, {2}}}}}, {2})},
                1);
  EXPECT_EQ(Rows(short_rows.value(), 0), (R{{0, 1, 0}, {1, 1, 1}}));
}

TEST(Plan, ReplicaParallelSplitsEachShardAmongItsHolders) {
  // Rows [0,4) held by ranks 0 and 1, rows [4,8) by ranks 2 and 3.
  Box lo{{0}, {4}}, hi{{4}, {4}};
  auto plan = BuildPlan({Holder(1, {{"x", {lo}}}), Holder(1, {{"x", {lo}}}),
                         Holder(1, {{"x", {hi}}}), Holder(1, {{"x", {hi}}})},
                        16);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  using R = std::vector<std::tuple<int64_t, int64_t, int>>;
  EXPECT_EQ(Rows(*plan, 0), (R{{0, 2, 0}, {2, 2, 1}, {4, 2, 2}, {6, 2, 3}}));
  EXPECT_FALSE(plan->arrays[0].replicated);
  // Holders in rank order, whatever order the ranks hold them in: ranks 1, 3.
  auto odd = BuildPlan({Holder(1, {{"x", {hi}}}), Holder(1, {{"x", {lo}}}),
                        Holder(1, {{"x", {hi}}}), Holder(1, {{"x", {lo}}})},
                       16);
  EXPECT_EQ(Rows(odd.value(), 0), (R{{0, 2, 1}, {2, 2, 3}, {4, 2, 0}, {6, 2, 2}}));
}

TEST(Plan, Errors) {
  Box lo{{0}, {4}}, hi{{4}, {4}}, mid{{2}, {4}};
  auto err = [](std::vector<RankDescription> r) { return BuildPlan(r).status().message(); };
  EXPECT_THAT(err({Holder(1, {{"x", {lo}}}), Holder(2, {{"x", {hi}}})}),
              HasSubstr("disagree on the step"));
  EXPECT_THAT(err({Holder(1, {{"x", {lo}}}), Holder(1, {{"x", {mid}}})}),
              HasSubstr("overlap partially"));
  EXPECT_THAT(err({Holder(1, {{"x", {lo}}}), Holder(1, {{"x", {}}})}), HasSubstr("cover 4 of 8"));
  EXPECT_THAT(err({Holder(1, {{"x", {lo}}, {"z", {lo, hi}}}), Holder(1, {{"x", {hi}}})}),
              HasSubstr("array 'z' is saved by rank 0 but not by rank 1"));
  auto other_shape = Holder(1, {{"x", {lo}}}, {9});
  EXPECT_THAT(err({Holder(1, {{"x", {lo, hi}}}), other_shape}),
              HasSubstr("rank 1 says float32 [9]"));
  RankDescription failed = Holder(1, {});
  failed.status = InvalidArgument("rank 1: bad");
  EXPECT_EQ(BuildPlan({Holder(1, {{"x", {lo, hi}}}), failed}).status().message(), "rank 1: bad");
}

TEST(Plan, DescriptionsRoundTrip) {
  RankDescription d = Holder(3, {{"x", {Box{{1}, {2}}}}});
  d.status = InvalidArgument("why");
  auto back = DecodeDescription(EncodeDescription(d));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->step, 3);
  EXPECT_EQ(back->status, d.status);
  EXPECT_EQ(back->arrays[0].boxes[0], (Box{{1}, {2}}));
}

// Descriptions arrive from other ranks: codes and dtypes outside their
// enums, and boxes outside their shapes, are Internal on rank 0, never cast.
TEST(Plan, DecodeDescriptionChecksWhatArrived) {
  const Box box{{0}, {8}};
  auto roundtrip = [](const RankDescription& d) { return DecodeDescription(EncodeDescription(d)); };
  EXPECT_TRUE(roundtrip(Holder(1, {{"x", {box}}})).ok());
  for (int code : {8, 200, 255}) {
    RankDescription d{1, Status(static_cast<StatusCode>(code), ""), {}};
    auto got = roundtrip(d);
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << code;
    EXPECT_THAT(got.status().message(), HasSubstr("unknown status code"));
  }
  for (int dtype : {15, 200, 255}) {
    RankDescription d = Holder(1, {{"x", {box}}});
    d.arrays[0].dtype = static_cast<DType>(dtype);
    auto got = roundtrip(d);
    EXPECT_EQ(got.status().code(), StatusCode::kInternal) << dtype;
    EXPECT_THAT(got.status().message(), HasSubstr("array 'x' is damaged: dtype"));
  }
  auto outside = roundtrip(Holder(1, {{"x", {Box{{4}, {8}}}}}));
  EXPECT_THAT(outside.status().message(), HasSubstr("box [4:12]"));
  auto shape = roundtrip(Holder(1, {{"x", {box}}}, {-8}));
  EXPECT_THAT(shape.status().message(), HasSubstr("shape [-8]"));
  EXPECT_EQ(DecodeDescription("\x9f").status().code(), StatusCode::kInternal);  // cut short
}

// A rank with an error of its own describes no arrays: the plan fails with
// the error, and the description stays small whatever the rank was given.
TEST(Plan, DescriptionOfAFailedRankHasNoArrays) {
  Snapshot snapshot;
  snapshot.arrays.push_back(StagedArray{"x", DType::kFloat32, {8}, {}});
  RankDescription d = Describe(3, InvalidArgument("rank 1: bad"), snapshot);
  EXPECT_TRUE(d.arrays.empty());
  auto back = DecodeDescription(EncodeDescription(d));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->status, InvalidArgument("rank 1: bad"));
}

}  // namespace
}  // namespace mhckpt::internal
