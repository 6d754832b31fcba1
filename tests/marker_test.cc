// io/marker.h: the commit marker written and parsed back; damage rejected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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
  io::PlanChunks(&m, 4);  // bfloat16 rows of 2: one row per chunk
  uint64_t sum = 0x1234;
  for (io::MarkerArray& a : m.arrays) {
    for (io::MarkerBox& b : a.boxes) {
      for (uint64_t& c : b.chunks) c = sum++;
    }
  }
  m.arrays[0].offset = 4096;
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
  // Version 2: chunk checksums and file offsets.
  EXPECT_EQ(m->format_version, 2);
  EXPECT_EQ(m->chunk_bytes, 4u);
  EXPECT_EQ(m->arrays[0].offset, 4096);
  EXPECT_EQ(m->arrays[1].offset, -1);
  EXPECT_EQ(m->arrays[0].boxes[1].chunk_rows, 1);
  EXPECT_EQ(m->arrays[0].boxes[1].chunks, (std::vector<uint64_t>{0x1236, 0x1237}));
  EXPECT_EQ(m->arrays[1].boxes[0].chunks, (std::vector<uint64_t>{0x1238}));
  EXPECT_EQ(io::MarkerToJson(*m), io::MarkerToJson(SampleMarker()));
}

// The plan's text leaves out the chunk lists; parsed as a plan, they come
// back sized as rank 0 sized them (their checksums zero, to be written).
TEST(Marker, PlanTextLeavesOutChunkListsAndParsesThemBack) {
  io::Marker plan = SampleMarker();
  for (io::MarkerArray& a : plan.arrays) {
    for (io::MarkerBox& b : a.boxes) std::fill(b.chunks.begin(), b.chunks.end(), 0);
  }
  const std::string text = io::MarkerToJson(plan, io::MarkerText::kPlan);
  EXPECT_EQ(text.find("chunk_rows"), std::string::npos);
  EXPECT_EQ(text.find("\"chunks\""), std::string::npos);
  EXPECT_LT(text.size(), io::MarkerToJson(plan).size());
  auto parsed = io::ParseMarker(text, "plan", io::MarkerText::kPlan);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(io::MarkerToJson(*parsed), io::MarkerToJson(plan));
  // As a commit marker the same text is refused: its chunks are missing.
  EXPECT_FALSE(io::ParseMarker(text, "m.json").ok());
}

TEST(Marker, ChunkRowsFitTheChunkSize) {
  const Box rows{{0, 0}, {10, 3}};  // float32 rows of 12 bytes
  EXPECT_EQ(io::ChunkRows(rows, DType::kFloat32, 24), 2);
  EXPECT_EQ(io::ChunkRows(rows, DType::kFloat32, 25), 2);
  EXPECT_EQ(io::ChunkRows(rows, DType::kFloat32, 5), 1);      // a row is never cut
  EXPECT_EQ(io::ChunkRows(rows, DType::kFloat32, 1000), 10);  // the whole box
  EXPECT_EQ(io::ChunkCount(rows, 2), 5);
  EXPECT_EQ(io::ChunkCount(rows, 3), 4);
  EXPECT_EQ(io::ChunkCount(Box{}, 1), 1);  // 0-d
  EXPECT_EQ(io::ChunkRows(Box{}, DType::kInt64, 1), 1);
}

// A version-1 marker (no chunks, no offsets) still parses, and is written
// back as version 1.
TEST(Marker, ReadsVersion1) {
  io::Marker v1 = SampleMarker();
  v1.format_version = 1;
  const std::string text = io::MarkerToJson(v1);
  EXPECT_EQ(text.find("chunk"), std::string::npos);
  EXPECT_EQ(text.find("offset"), std::string::npos);
  auto m = io::ParseMarker(text, "x");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_version, 1);
  EXPECT_EQ(m->arrays[0].boxes[0].chunk_rows, 0);
  EXPECT_TRUE(m->arrays[0].boxes[0].chunks.empty());
  EXPECT_EQ(m->arrays[0].offset, -1);
  EXPECT_EQ(io::MarkerToJson(*m), text);
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
  // Version 2's fields.
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["chunks"].erase(0); }), "few"),
              HasSubstr("1 chunk checksums of 1 rows each do not cover it"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["chunk_rows"] = 0; }), "rows"),
              HasSubstr("do not cover it"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["chunks"][0] = "xx"; }), "sum"),
              HasSubstr("bad chunk checksum 'xx'"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1]["chunks"] = "x"; }), "type"),
              HasSubstr("malformed"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["boxes"][1].erase("chunks"); }), "none"),
              HasSubstr("missing field 'chunks'"));
  EXPECT_THAT(fails(edit([](auto& j) { j["arrays"][0]["offset"] = -2; }), "offset"),
              HasSubstr("negative file offset -2"));
  EXPECT_THAT(fails(edit([](auto& j) { j.erase("chunk_bytes"); }), "chunk size"),
              HasSubstr("missing field 'chunk_bytes'"));
  EXPECT_THAT(fails(edit([](auto& j) { j["chunk_bytes"] = 0; }), "chunk size 0"),
              HasSubstr("chunk size 0"));
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
