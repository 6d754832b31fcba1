// Unit tests of single functions: boxes, names, the marker parser, the planner.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "base/types.h"
#include "coordinator/plan.h"
#include "coordinator/retention.h"
#include "io/layout.h"
#include "io/marker.h"
#include "worker/copy.h"
#include "worker/staging_pool.h"

namespace mhckpt {
namespace {

using ::testing::HasSubstr;

TEST(Types, VolumeRejectsNegativeAndOverflow) {
  EXPECT_EQ(Volume({}), 1);
  EXPECT_EQ(Volume({3, 0, 5}), 0);
  EXPECT_EQ(Volume({1001, 7}), 7007);
  EXPECT_FALSE(Volume({-1}).has_value());
  EXPECT_FALSE(Volume({int64_t{1} << 40, int64_t{1} << 40}).has_value());
}

TEST(Types, BoxInShape) {
  EXPECT_EQ(CheckBoxInShape(Box{{0, 2}, {4, 3}}, {4, 5}), "");
  EXPECT_THAT(CheckBoxInShape(Box{{0, 3}, {4, 3}}, {4, 5}), HasSubstr("past the extent 5"));
  EXPECT_THAT(CheckBoxInShape(Box{{0}, {4}}, {4, 5}), HasSubstr("for a 2-d array"));
  EXPECT_THAT(CheckBoxInShape(Box{{-1}, {1}}, {4}), HasSubstr("negative"));
  EXPECT_NE(CheckBoxInShape(Box{{1}, {INT64_MAX}}, {4}), "");  // no overflow
  EXPECT_EQ(BoxToString(Box{{0, 3}, {5, 4}}), "[0:5, 3:7]");
  // Found by fuzzing: forged boxes near INT64_MAX must not overflow.
  EXPECT_EQ(BoxToString(Box{{INT64_MAX}, {2}}), "[9223372036854775807:9223372036854775807+2]");
  EXPECT_THAT(CheckBoxInShape(Box{{INT64_MAX - 1}, {5}}, {4}), HasSubstr("past 2^63"));
}

TEST(Types, ArrayNames) {
  EXPECT_EQ(CheckArrayName("params/layer0/w"), "");
  for (const char* bad : {"", "/a", "a//b", "a/../b", "..", "a/", "tab\there"}) {
    EXPECT_NE(CheckArrayName(bad), "") << bad;
  }
}

TEST(Types, DTypeNamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
    EXPECT_GT(DTypeSize(t), 0u);
  }
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_FALSE(DTypeFromName("float128").has_value());
}

TEST(Layout, StepDirNames) {
  EXPECT_EQ(io::StepDirName(42), "step_0000000042");
  EXPECT_EQ(io::ParseStepDirName("step_0000000042"), 42);
  EXPECT_FALSE(io::ParseStepDirName("step_42").has_value());  // one spelling
  EXPECT_FALSE(io::ParseStepDirName("step_00000000x2").has_value());
  EXPECT_FALSE(io::ParseStepDirName("other").has_value());
}

io::Marker SampleMarker() {
  io::Marker m;
  m.step = 7;
  m.world_size = 2;
  m.arrays.push_back(
      {"a", DType::kBFloat16, {4, 2}, false, {{Box{{0, 0}, {2, 2}}, 0}, {Box{{2, 0}, {2, 2}}, 1}}});
  m.arrays.push_back({"b", DType::kInt64, {}, true, {{Box{}, 0}}});
  m.user_metadata["k"] = "v";
  return m;
}

TEST(Marker, RoundTrips) {
  auto m = io::ParseMarker(io::MarkerToJson(SampleMarker()), "x");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->arrays[0].dtype, DType::kBFloat16);
  EXPECT_EQ(m->arrays[0].boxes[1].writer, 1);
  EXPECT_TRUE(m->arrays[1].replicated);
  EXPECT_EQ(m->user_metadata.at("k"), "v");
  EXPECT_NE(m->Find("b"), nullptr);
  EXPECT_EQ(m->Find("c"), nullptr);
}

TEST(Marker, RejectsDamage) {
  std::string good = io::MarkerToJson(SampleMarker());
  auto fails = [](const std::string& text, const std::string& why) {
    auto m = io::ParseMarker(text, "m.json");
    EXPECT_FALSE(m.ok()) << why;
    if (!m.ok()) EXPECT_EQ(m.status().code(), StatusCode::kDataLoss) << m.status().ToString();
    return m.ok() ? std::string() : m.status().message();
  };
  fails(good.substr(0, good.size() / 2), "truncated");
  fails("", "empty");
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(good);
    f(j);
    return j.dump();
  };
  EXPECT_THAT(fails(edit([](auto& j) { j["format_version"] = 99; }), "version"),
              HasSubstr("unknown format version 99"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["dtype"] = "float128"; }), "dtype"),
              HasSubstr("unknown dtype"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["shape"][0] = -4; }), "negative"),
              HasSubstr("invalid shape"));
  EXPECT_THAT(fails(edit([](auto& j) {
                      j["arrays"][0]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
                    }),
                    "huge"),
              HasSubstr("array 'a'"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["writer"] = 5; }), "writer"),
              HasSubstr("writer rank 5"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["count"][0] = 3; }), "box"),
              HasSubstr("box [2:5, 0:2]"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["name"] = "../x"; }), "name"),
              HasSubstr("bad name"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["shape"] = "oops"; }), "type"),
              HasSubstr("malformed"));
  // Found by fuzzing: numbers that nlohmann would convert silently.
  EXPECT_THAT(fails(edit([](auto& j) { j["format_version"] = 4294967297ULL; }), "wide"),
              HasSubstr("malformed"));
  EXPECT_THAT(fails(edit([](auto& j) { j["format_version"] = true; }), "bool"),
              HasSubstr("malformed"));
  EXPECT_THAT(fails(edit([](auto& j) { j["step"] = 7.9; }), "float"), HasSubstr("malformed"));
  EXPECT_THAT(fails(edit([](auto& j) { j["step"] = 1e300; }), "huge float"),
              HasSubstr("malformed"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["writer"] = true; }), "writer"),
              HasSubstr("malformed"));
}

// The parser reads SAX events (io/marker.cc): key order, unknown keys with
// nested values and repeated keys must not matter, as with a DOM.
TEST(Marker, ParsesAnyKeyOrderIgnoresUnknownKeysLastRepeatWins) {
  const std::string good = io::MarkerToJson(SampleMarker());
  nlohmann::json j = nlohmann::json::parse(good);
  // Reversed key order everywhere, with unknown keys holding nested values.
  std::function<nlohmann::ordered_json(const nlohmann::json&)> reverse =
      [&](const nlohmann::json& v) -> nlohmann::ordered_json {
    if (v.is_object()) {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      if (!v.contains("k")) {  // not user_metadata, whose values must be strings
        o["zz_unknown"] = {{"boxes", {1, {{"x", nullptr}}}}, {"shape", "s"}};
      }
      for (auto it = v.rbegin(); it != v.rend(); ++it) o[it.key()] = reverse(it.value());
      return o;
    }
    if (v.is_array()) {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const auto& e : v) a.push_back(reverse(e));
      return a;
    }
    return nlohmann::ordered_json::parse(v.dump());
  };
  auto m = io::ParseMarker(reverse(j).dump(), "x");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(io::MarkerToJson(*m), good);
  // A repeated key: the last value counts, as nlohmann's DOM keeps it.
  std::string twice = good;
  twice.insert(1, "\"step\":\"bad\",\"arrays\":7,");
  m = io::ParseMarker(twice, "x");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(io::MarkerToJson(*m), good);
  // Missing or mistyped fields are malformed, wherever they are.
  j.erase("step");
  EXPECT_THAT(io::ParseMarker(j.dump(), "x").status().message(), HasSubstr("malformed"));
  j = nlohmann::json::parse(good);
  j["arrays"][0]["boxes"][0].erase("start");
  EXPECT_THAT(io::ParseMarker(j.dump(), "x").status().message(), HasSubstr("malformed"));
  j = nlohmann::json::parse(good);
  j["arrays"][1]["shape"] = {{1}};
  EXPECT_THAT(io::ParseMarker(j.dump(), "x").status().message(), HasSubstr("malformed"));
  j = nlohmann::json::parse(good);
  j["user_metadata"]["k"] = 1;
  EXPECT_THAT(io::ParseMarker(j.dump(), "x").status().message(), HasSubstr("malformed"));
  EXPECT_THAT(io::ParseMarker("[1, 2]", "x").status().message(), HasSubstr("malformed"));
}

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
  auto plan = BuildPlan(ranks, 32);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  using R = std::vector<std::tuple<int64_t, int64_t, int>>;
  EXPECT_EQ(Rows(*plan, 0), (R{{0, 3, 0}, {3, 3, 1}, {6, 2, 2}}));
  EXPECT_TRUE(plan->arrays[0].replicated);  // every holder had the whole array
  EXPECT_EQ(plan->total_bytes, 2u * 32);    // each byte counted once
  // Identical on every call (every rank follows rank 0's plan; cached plans too).
  EXPECT_EQ(MarkerToJson(*plan), MarkerToJson(BuildPlan(ranks, 32).value()));
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

TEST(Retention, KeepsNewestAndPeriodSteps) {
  std::vector<int64_t> steps{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(StepsToDelete(steps, 0, 0), std::vector<int64_t>{});
  EXPECT_EQ(StepsToDelete(steps, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(StepsToDelete(steps, 2, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(StepsToDelete({5}, 1, 0), std::vector<int64_t>{});
}

TEST(StagingPool, ReusesBuffersBetweenSaves) {
  StagingPool pool(64 << 20);
  std::byte* first;
  {
    auto b = pool.Acquire(5 << 20);
    ASSERT_TRUE(b.ok());
    first = b->data();
    std::memset(first, 1, 5 << 20);
  }
  auto again = pool.Acquire(3 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);                     // the touched buffer comes back
  EXPECT_EQ(pool.allocated_bytes(), size_t{6} << 20);  // rounded to 2 MiB pages
}

TEST(StagingPool, WaitsForBudgetInsteadOfAllocating) {
  StagingPool pool(8 << 20);
  auto held = pool.Acquire(6 << 20);
  ASSERT_TRUE(held.ok());
  double waited = 0;
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    *held = StagingBuffer();  // the earlier save commits
  });
  auto next = pool.Acquire(6 << 20, &waited);
  releaser.join();
  ASSERT_TRUE(next.ok());
  EXPECT_GE(waited, 0.15);
  EXPECT_LE(pool.allocated_bytes(), size_t{8} << 20);
}

TEST(StagingPool, DefaultBudgetIsOneSaveAndLargeRequestsAreServedAlone) {
  StagingPool pool;  // one save's worth
  {
    auto a = pool.Acquire(4 << 20);
    ASSERT_TRUE(a.ok());
  }
  auto big = pool.Acquire(10 << 20);  // larger: the old buffer is freed first
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(pool.allocated_bytes(), size_t{10} << 20);
  EXPECT_FALSE(pool.Acquire(0).value().data());
}

TEST(ParallelCopy, CopiesEveryByteWithManyThreads) {
  std::vector<std::vector<char>> src, dst;
  std::vector<CopyTask> tasks;
  for (size_t n : {size_t{1}, size_t{40} << 20, size_t{4097}, size_t{0}, size_t{7} << 20}) {
    src.emplace_back(n);
    for (size_t i = 0; i < n; ++i) src.back()[i] = static_cast<char>(i * 131 + n);
    dst.emplace_back(n, 0);
  }
  for (size_t i = 0; i < src.size(); ++i)
    tasks.push_back({dst[i].data(), src[i].data(), src[i].size()});
  ParallelCopy(tasks, 3);
  EXPECT_TRUE(src == dst);
}

TEST(Cuda, AbsentDeviceIsReportedNotFatal) {
  if (CudaAvailable()) GTEST_SKIP() << "a CUDA device is present";
  char host[8] = {};
  CopyTask t{host, host, 8};
  EXPECT_EQ(CopyDeviceToHost({&t, 1}).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace mhckpt
