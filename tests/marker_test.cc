// io/marker.h: the commit marker written and parsed back; damage rejected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "io/marker.h"

namespace mhckpt {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace mhckpt
