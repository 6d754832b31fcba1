// coordinator/rank_report.h: what rank 0 reads from every rank's report;
// codes outside the enum and damaged bytes are Internal, never a cast.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/rank_report.h"

namespace mhckpt::internal {
namespace {

using ::testing::HasSubstr;

std::string Cbor(const nlohmann::json& j) {
  std::vector<uint8_t> bytes = nlohmann::json::to_cbor(j);
  return {bytes.begin(), bytes.end()};
}

TEST(RankReport, RoundTripsStatusAndSums) {
  std::vector<std::vector<BoxSum>> sums;
  Status s = CollectReports(
      {EncodeReport(OkStatus(), {{1, 2, 3}}), EncodeReport(IoError("rank 1: disk full"), {})},
      &sums);
  EXPECT_EQ(s, IoError("rank 1: disk full"));
  ASSERT_EQ(sums.size(), 2u);
  ASSERT_EQ(sums[0].size(), 1u);
  EXPECT_EQ(sums[0][0].sum, 3u);
}

TEST(RankReport, OutOfRangeCodesAreInternal) {
  for (int64_t code : {int64_t{-1}, int64_t{8}, int64_t{1000}, int64_t{1} << 40}) {
    std::vector<std::vector<BoxSum>> sums;
    Status s = CollectReports(
        {Cbor(nlohmann::json::array({code, "forged", nlohmann::json::array()}))}, &sums);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << code;
    EXPECT_THAT(s.message(), HasSubstr("unknown status code")) << code;
  }
}

TEST(RankReport, DamagedBytesAreInternal) {
  std::vector<std::vector<BoxSum>> sums;
  for (const std::string& bytes :
       {std::string(), std::string("\xff\x00\x01", 3), Cbor(nlohmann::json::array({"x", 1}))}) {
    EXPECT_EQ(CollectReports({bytes}, &sums).code(), StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace mhckpt::internal
