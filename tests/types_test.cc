// base/types.h: boxes, volumes, array names, the row split.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

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

TEST(Types, SplitRangeIsContiguousNearEqualInOrder) {
  EXPECT_EQ(SplitRange(10, 3, 0), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(SplitRange(10, 3, 1), (std::pair<int64_t, int64_t>{4, 7}));
  EXPECT_EQ(SplitRange(10, 3, 2), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_EQ(SplitRange(2, 4, 3), (std::pair<int64_t, int64_t>{2, 2}));  // more parts than rows
  for (int64_t n : {0, 1, 7, 1001}) {
    for (int parts : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int part = 0; part < parts; ++part) {
        auto [begin, end] = SplitRange(n, parts, part);
        EXPECT_EQ(begin, next) << n << " " << parts << " " << part;
        EXPECT_GE(end - begin, n / parts);
        EXPECT_LE(end - begin, n / parts + 1);
        next = end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

}  // namespace
}  // namespace mhckpt
