// coordinator/input_checks.h: the local checks of Open's and Save's inputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "coordinator/input_checks.h"

namespace mhckpt::internal {
namespace {

using ::testing::HasSubstr;

TEST(InputChecks, UserMetadata) {
  EXPECT_TRUE(CheckUserMetadata({}, 0).ok());
  EXPECT_TRUE(CheckUserMetadata({{"k", "caf\xc3\xa9"}, {"empty", ""}}, 0).ok());
  Status s = CheckUserMetadata({{"k", "\xff\xfe bad"}}, 0);
  EXPECT_EQ(s, InvalidArgument("rank 0: user metadata: the value of key 'k' is not valid UTF-8 "
                               "(byte 0xff at offset 0)"));
  EXPECT_THAT(CheckUserMetadata({{"\xfe", "v"}}, 0).message(), HasSubstr("key '\\xfe' is not"));
  EXPECT_THAT(CheckUserMetadata({{"", "v"}}, 0).message(), HasSubstr("an empty key"));
  EXPECT_THAT(CheckUserMetadata({{std::string(kMaxMetadataKeyBytes + 1, 'k'), ""}}, 0).message(),
              HasSubstr("1025 bytes long"));
  EXPECT_THAT(CheckUserMetadata({{"a", std::string(kMaxMetadataBytes, 'v')}}, 0).message(),
              HasSubstr("add up to more than"));
}

TEST(InputChecks, Options) {
  EXPECT_TRUE(CheckOptions(Options{}, 0).ok());
  Options o;
  o.collective_timeout_seconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(CheckOptions(o, 3).message(), HasSubstr("rank 3: Options::collective_timeout"));
  o = Options{};
  o.collective_timeout_seconds = 0;  // off
  EXPECT_TRUE(CheckOptions(o, 0).ok());
  o.snapshot_threads = 257;
  EXPECT_EQ(CheckOptions(o, 0).code(), StatusCode::kInvalidArgument);
  o = Options{};
  o.transfer = static_cast<Transfer>(2);
  EXPECT_THAT(CheckOptions(o, 0).message(), HasSubstr("transfer 2 is not a Transfer"));
  // Subfiles: per node or per k ranks, at format 3, written by the direct engine.
  o = Options{};
  o.files = DataFiles::PerNode();
  EXPECT_TRUE(CheckOptions(o, 0).ok());
  o.files = DataFiles::PerRanks(4);
  EXPECT_TRUE(CheckOptions(o, 0).ok());
  o.files.ranks_per_file = -2;
  EXPECT_THAT(CheckOptions(o, 1).message(), HasSubstr("rank 1: Options::files.ranks_per_file -2"));
  o.files = DataFiles::PerNode();
  o.format_version = 2;
  EXPECT_THAT(CheckOptions(o, 0).message(), HasSubstr("subfiles need format_version 3"));
  o.format_version = 3;
  o.data_path = DataPath::kHdf5;
  EXPECT_THAT(CheckOptions(o, 0).message(), HasSubstr("written by the direct engine"));
}

TEST(InputChecks, StepAndRoot) {
  EXPECT_TRUE(CheckStep(0, 0).ok());
  EXPECT_TRUE(CheckStep(kMaxStep, 0).ok());
  EXPECT_FALSE(CheckStep(kMaxStep + 1, 0).ok());
  EXPECT_FALSE(CheckStep(std::numeric_limits<int64_t>::min(), 0).ok());
  EXPECT_TRUE(CheckRootPath("/ckpt", 0).ok());
  EXPECT_FALSE(CheckRootPath("", 0).ok());
  EXPECT_FALSE(CheckRootPath(std::string("/a\0b", 4), 0).ok());
  EXPECT_FALSE(CheckRootPath("/" + std::string(5000, 'r'), 0).ok());
}

}  // namespace
}  // namespace mhckpt::internal
