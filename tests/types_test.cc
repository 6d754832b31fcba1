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

TEST(Types, ArrayNameLimits) {
  std::string deep = "a";
  for (size_t i = 1; i < kMaxNameDepth; ++i) deep += "/a";
  EXPECT_EQ(CheckArrayName(deep), "");
  EXPECT_THAT(CheckArrayName(deep + "/a"), HasSubstr("65 path components, more than 64"));
  EXPECT_EQ(CheckArrayName(std::string(kMaxNameBytes, 'n')), "");
  EXPECT_THAT(CheckArrayName(std::string(kMaxNameBytes + 1, 'n')), HasSubstr("1025 bytes long"));
}

TEST(Types, Utf8) {
  for (const char* good : {"", "plain", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                           "\xef\xbf\xbf", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_EQ(CheckUtf8(good), "") << good;
  }
  EXPECT_EQ(CheckUtf8("\xff\xfe bad"), "not valid UTF-8 (byte 0xff at offset 0)");
  EXPECT_EQ(CheckUtf8("ab\xc0\xaf"), "not valid UTF-8 (byte 0xc0 at offset 2)");    // overlong '/'
  EXPECT_EQ(CheckUtf8("\xe0\x80\xaf"), "not valid UTF-8 (byte 0x80 at offset 1)");  // overlong
  EXPECT_EQ(CheckUtf8("\xed\xa0\x80"), "not valid UTF-8 (byte 0xa0 at offset 1)");  // surrogate
  EXPECT_EQ(CheckUtf8("\xf4\x90\x80\x80"),
            "not valid UTF-8 (byte 0x90 at offset 1)");  // > U+10FFFF
  EXPECT_EQ(CheckUtf8("\xc3("), "not valid UTF-8 (byte 0x28 at offset 1)");
  EXPECT_THAT(CheckUtf8("ok \xe2\x82"), HasSubstr("cut short at offset 3"));
  EXPECT_EQ(CheckUtf8(std::string("nul\0inside", 10)), "");  // JSON escapes it
}

TEST(Types, QuoteForMessage) {
  EXPECT_EQ(QuoteForMessage("w\xff\n\\"), "w\\xff\\x0a\\x5c");
  EXPECT_EQ(QuoteForMessage(std::string(100, 'n'), 4), "nnnn...(100 bytes)");
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
