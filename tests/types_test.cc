// base/types.h: boxes, volumes, array names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "base/types.h"

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

}  // namespace
}  // namespace mhckpt
