// coordinator/layouts.h: ranks with equal descriptions send one; the plan from
// the distinct descriptions is the plan from all of them, errors included.
#include "coordinator/layouts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/plan.h"
#include "io/marker.h"

namespace mhckpt::internal {
namespace {

RankDescription Holder(int64_t step, std::vector<Box> x_boxes, std::vector<int64_t> shape = {8}) {
  RankDescription d;
  d.step = step;
  d.arrays.push_back({"x", DType::kFloat32, shape, std::move(x_boxes)});
  d.arrays.push_back({"y", DType::kFloat32, {8}, {Box{{0}, {8}}}});
  return d;
}

// The plan (or error) from all ranks and from the distinct layouts, as JSON.
void ExpectSamePlan(const std::vector<RankDescription>& ranks, uint64_t rp_min_bytes = 0) {
  std::vector<std::string> encoded, digests;
  for (const RankDescription& d : ranks) {
    encoded.push_back(EncodeDescription(d));
    digests.push_back(LayoutDigest(encoded.back()));
  }
  const LayoutGroups groups = GroupLayouts(digests);
  std::vector<std::string> sent(ranks.size());  // only senders send
  for (int r : groups.first_rank) sent[static_cast<size_t>(r)] = encoded[static_cast<size_t>(r)];
  Result<io::Marker> all = BuildPlan(ranks, rp_min_bytes);
  Result<io::Marker> dedup = PlanLayouts(sent, groups, rp_min_bytes, io::kChunkBytes);
  ASSERT_EQ(all.ok(), dedup.ok()) << all.status().ToString() << " / " << dedup.status().ToString();
  if (!all.ok()) {
    EXPECT_EQ(all.status().ToString(), dedup.status().ToString());
    return;
  }
  EXPECT_EQ(io::MarkerToJson(*all), io::MarkerToJson(*dedup));
}

TEST(Layouts, ReplicasShareOneLayout) {
  Box lo{{0}, {4}}, hi{{4}, {4}};
  std::vector<std::string> digests;
  for (int r = 0; r < 6; ++r) {
    digests.push_back(LayoutDigest(EncodeDescription(Holder(1, {r % 2 ? hi : lo}))));
  }
  LayoutGroups g = GroupLayouts(digests);
  EXPECT_EQ(g.first_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(g.layout_of_rank, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(LayoutDigest("a").size(), 24u);
  EXPECT_NE(LayoutDigest("a"), LayoutDigest("b"));
}

TEST(Layouts, SamePlanAsFromEveryRank) {
  Box lo{{0}, {4}}, hi{{4}, {4}}, all{{0}, {8}};
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {hi}), Holder(1, {lo}), Holder(1, {hi})});
  ExpectSamePlan({Holder(1, {all}), Holder(1, {lo}), Holder(1, {hi}), Holder(1, {all})});
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {hi}), Holder(1, {lo}), Holder(1, {hi})}, 1);
  ExpectSamePlan({Holder(1, {all}), Holder(1, {all}), Holder(1, {all})}, 1);
}

TEST(Layouts, SameErrorAsFromEveryRank) {
  Box lo{{0}, {4}}, hi{{4}, {4}}, mid{{2}, {4}};
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {hi}), Holder(2, {lo})});       // step
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {lo}), Holder(1, {mid})});      // overlap
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {lo}), Holder(1, {lo})});       // hole
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {hi}), Holder(1, {hi}, {9})});  // shape
  RankDescription bad = Holder(1, {hi});
  bad.status = InvalidArgument("rank 2: array 'x': null data");
  ExpectSamePlan({Holder(1, {lo}), Holder(1, {hi}), bad, bad});  // own error
  RankDescription missing = Holder(1, {hi});
  missing.arrays.pop_back();
  ExpectSamePlan({Holder(1, {lo}), missing, missing});  // missing array
}

TEST(Layouts, TruncatedDescriptionIsAnErrorNotACrash) {
  const std::string bytes = EncodeDescription(Holder(1, {Box{{0}, {8}}}));
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeDescription(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeDescription(bytes + "x").ok());
  std::string huge = bytes;
  huge[huge.size() - 2] = '\x7f';  // the length of the last box's count: past the end
  EXPECT_FALSE(DecodeDescription(huge).ok());
  // Negative and large values survive the encoding: the bad box is reported
  // as it was sent, not mangled into a valid one.
  RankDescription d = Holder(1, {Box{{-5}, {int64_t{1} << 62}}});
  Result<RankDescription> bad = DecodeDescription(EncodeDescription(d));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(BoxToString(d.arrays[0].boxes[0])), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace mhckpt::internal
