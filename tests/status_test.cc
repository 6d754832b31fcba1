// base/status.h: codes that arrive from other ranks are range-checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "base/guard.h"
#include "base/status.h"

namespace mhckpt {
namespace {

using ::testing::HasSubstr;

TEST(Status, CodeFromIntAcceptsOnlyTheEnum) {
  EXPECT_EQ(StatusCodeFromInt(0), StatusCode::kOk);
  EXPECT_EQ(StatusCodeFromInt(7), StatusCode::kInternal);
  for (int64_t bad : {int64_t{-1}, int64_t{8}, int64_t{255}, int64_t{1} << 40}) {
    EXPECT_FALSE(StatusCodeFromInt(bad).has_value()) << bad;
  }
}

TEST(Status, SerializeRoundTrips) {
  Status s = DataLoss("array 'w' box [0:4]");
  EXPECT_EQ(Status::Deserialize(s.Serialize()), s);
  EXPECT_EQ(Status::Deserialize(OkStatus().Serialize()), OkStatus());
}

TEST(Status, DeserializeRefusesUnknownCodes) {
  for (int code : {8, 42, 255}) {
    std::string bytes(1, static_cast<char>(code));
    bytes += "message";
    Status s = Status::Deserialize(bytes);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << code;
    EXPECT_THAT(s.message(), HasSubstr("unknown status code " + std::to_string(code)));
  }
  EXPECT_EQ(Status::Deserialize("").code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfAnErrorAbortsWithTheStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<int> r = NotFound("no step 7 in '/ckpt'");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on an error: NOT_FOUND: no step 7 in '/ckpt'");
  EXPECT_DEATH((void)*r, "NOT_FOUND: no step 7");
  EXPECT_DEATH((void)std::move(r).value(), "NOT_FOUND: no step 7");
  const Result<std::string> c = DataLoss("array 'w'");
  EXPECT_DEATH((void)c->size(), "DATA_LOSS: array 'w'");
}

TEST(Result, ValueOfAValue) {
  Result<std::string> r = std::string("abc");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "abc");
  EXPECT_EQ(r->size(), 3u);
  EXPECT_EQ(std::move(r).value(), "abc");
}

TEST(Guarded, TurnsExceptionsIntoInternal) {
  EXPECT_EQ(Guarded("here", [] { return DataLoss("x"); }), DataLoss("x"));
  EXPECT_TRUE(Guarded("here", [] {}).ok());
  EXPECT_EQ(Guarded("rank 2: commit", [] { throw std::runtime_error("boom"); }),
            Internal("rank 2: commit: unexpected exception: boom"));
  EXPECT_EQ(Guarded("w", []() -> Status { throw 7; }),
            Internal("w: unexpected exception: an exception of unknown type"));
}

}  // namespace
}  // namespace mhckpt
