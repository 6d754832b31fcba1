// io/marker.h: the commit marker written and parsed back; damage rejected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "io/marker.h"
#include "io/step_index.h"

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
  io::PlanChunks(&m, 4, 2);  // bfloat16 rows of 2: one row per chunk
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

// ---- Version 3: the marker without checksums, and the index file ----

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
  return static_cast<bool>(f);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A fresh directory, removed at the end of the test.
struct TempDir {
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "mhckpt_index.XXXXXX").string();
    path = mkdtemp(t.data()) != nullptr ? t : "";
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string path;
};

// SampleMarker as version 3, with a third array whose boxes are no grid.
io::Marker SampleMarkerV3() {
  io::Marker m = SampleMarker();
  m.arrays.push_back(
      {"c",
       DType::kFloat32,
       {4, 2},
       false,
       {{Box{{0, 0}, {1, 2}}, 1}, {Box{{1, 0}, {3, 1}}, 0}, {Box{{1, 1}, {3, 1}}, 1}}});
  io::PlanChunks(&m, 8, 3);
  return m;
}

// Fills the checksums of every box of `m` with distinct values, writes the
// index file at `path` as the writers would (their records at their places),
// and records its size and checksum in `m`.
void WriteIndex(io::Marker* m, const std::string& path) {
  auto layout = io::IndexLayout::Of(*m, "x");
  ASSERT_TRUE(layout.ok());
  std::string file = io::IndexHeader(m->step);
  std::vector<uint64_t> checks;
  uint64_t sum = 0x5000;
  for (size_t a = 0; a < m->arrays.size(); ++a) {
    for (size_t b = 0; b < m->arrays[a].boxes.size(); ++b) {
      io::MarkerBox& box = m->arrays[a].boxes[b];
      box.checksum = sum++;
      box.chunks.clear();
      for (int64_t c = 0; c < io::ChunkCount(box.box, box.chunk_rows); ++c) {
        box.chunks.push_back(sum++);
      }
      ASSERT_EQ(file.size(), layout->offset(a, b));
      std::optional<io::BoxPlace> place;  // with subfiles: file a % files, offset 4096 b
      if (m->files > 0) {
        box.file = static_cast<int64_t>(a) % m->files;
        box.file_offset = 4096 * static_cast<int64_t>(b);
        place =
            io::BoxPlace{static_cast<uint64_t>(box.file), static_cast<uint64_t>(box.file_offset)};
      }
      checks.push_back(io::AppendIndexRecord(a, b, box.checksum, box.chunks, &file, place));
    }
  }
  m->index = {file.size(), io::IndexChecksum(checks)};
  ASSERT_TRUE(WriteFile(path, file));
}

TEST(MarkerV3, RegularShardingIsOneGridAndEveryChecksumIsInTheIndex) {
  io::Marker m = SampleMarkerV3();
  m.index = {1234, 0x42};
  const std::string text = io::MarkerToJson(m);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["format_version"], 3);
  EXPECT_EQ(j["arrays"][0]["grid"], nlohmann::json::parse("[[0,2,4],[0,2]]"));
  EXPECT_EQ(j["arrays"][0]["writers"], nlohmann::json::parse("[0,1]"));
  EXPECT_FALSE(j["arrays"][0].contains("boxes"));
  EXPECT_EQ(j["arrays"][1]["grid"], nlohmann::json::array());  // a scalar: one cell
  EXPECT_EQ(j["arrays"][2]["boxes"].size(), 3u);               // not a grid: listed
  EXPECT_EQ(text.find("chunk_rows"), std::string::npos);
  EXPECT_EQ(text.find("xxh3:0000000000000042"), text.rfind("xxh3:"));  // the index's only
  EXPECT_EQ(j["index"]["bytes"], 1234);
  EXPECT_EQ(j["index"]["file"], "index.bin");
  // A repeated "index" object replaces the first whole, as in a DOM: the
  // earlier one's checksum must not fill in for the later one's missing one.
  std::string twice = text;
  twice.insert(twice.rfind('}'), R"(,"index":{"bytes":1234,"file":"index.bin"})");
  EXPECT_THAT(io::ParseMarker(twice, "x").status().message(), HasSubstr("missing field"));
  // One spelling per checksum: the lowercase hex the writer writes.
  std::string upper = text;
  upper.replace(upper.find("xxh3:0000000000000042"), 21, "xxh3:00000000000000AB");
  EXPECT_EQ(io::ParseMarker(upper, "x").status().code(), StatusCode::kDataLoss);
  // Parsed as a plan: the same boxes and chunk sizes, no index.
  auto plan = io::ParseMarker(text, "plan", io::MarkerText::kPlan);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (size_t a = 0; a < m.arrays.size(); ++a) {
    ASSERT_EQ(plan->arrays[a].boxes.size(), m.arrays[a].boxes.size());
    for (size_t b = 0; b < m.arrays[a].boxes.size(); ++b) {
      EXPECT_EQ(plan->arrays[a].boxes[b].box, m.arrays[a].boxes[b].box);
      EXPECT_EQ(plan->arrays[a].boxes[b].writer, m.arrays[a].boxes[b].writer);
      EXPECT_EQ(plan->arrays[a].boxes[b].chunk_rows, m.arrays[a].boxes[b].chunk_rows);
      EXPECT_TRUE(plan->arrays[a].boxes[b].chunks.empty());
    }
  }
  // As a commit marker it must describe an index of exactly its records.
  EXPECT_THAT(io::ParseMarker(text, "m.json").status().message(),
              HasSubstr("the index is 1234 bytes, but its boxes' records take"));
  m.index.bytes = io::IndexLayout::Of(m, "x")->total();
  auto parsed = io::ParseMarker(io::MarkerToJson(m), "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->index.checksum, 0x42u);
  EXPECT_EQ(io::MarkerToJson(*parsed), io::MarkerToJson(m));
}

TEST(MarkerV3, GridCutsOnlyForCellsInRowMajorOrder) {
  io::MarkerArray a{"a", DType::kInt8, {4, 6}, false, {}};
  for (int64_t r : {0, 1}) {
    for (int64_t c : {0, 2, 5}) {
      a.boxes.push_back({Box{{r * 2, c}, {2, c == 0 ? 2 : c == 2 ? 3 : 1}}, 0});
    }
  }
  ASSERT_TRUE(io::GridCuts(a).has_value());
  EXPECT_EQ(*io::GridCuts(a), (std::vector<std::vector<int64_t>>{{0, 2, 4}, {0, 2, 5, 6}}));
  std::swap(a.boxes[0], a.boxes[1]);  // the same tiling, out of order
  EXPECT_FALSE(io::GridCuts(a).has_value());
  std::swap(a.boxes[0], a.boxes[1]);
  a.boxes.pop_back();  // a cell missing
  EXPECT_FALSE(io::GridCuts(a).has_value());
}

TEST(MarkerV3, RejectsDamagedGrids) {
  io::Marker m = SampleMarkerV3();
  m.index.bytes = io::IndexLayout::Of(m, "x")->total();
  const std::string good = io::MarkerToJson(m);
  auto fails = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = nlohmann::json::parse(good);
    f(j);
    auto parsed = io::ParseMarker(j.dump(), "m.json");
    EXPECT_FALSE(parsed.ok());
    if (!parsed.ok()) EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
    return parsed.ok() ? std::string() : parsed.status().message();
  };
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["grid"][0] = {0, 3, 2, 4};
              }),
              HasSubstr("array 'a': the grid's cuts of dimension 0 do not rise from 0 to 4"));
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["grid"][1] = {0, 3};
              }),
              HasSubstr("do not rise from 0 to 2"));
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["writers"] = {0, 1, 1};
              }),
              HasSubstr("a grid of 2 cells with 3 writers"));
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["writers"] = {0, 9};
              }),
              HasSubstr("writer rank 9 outside world size 2"));
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["grid"] = {{0, 4}};
              }),
              HasSubstr("a grid of 1 dimensions for a shape of 2"));
  // A grid of 2^62 cells in a few bytes: refused before any allocation.
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
                nlohmann::json cuts = nlohmann::json::array();
                for (int64_t i = 0; i <= 64; ++i) cuts.push_back(i << 25);
                j["arrays"][0]["grid"] = {cuts, cuts};
              }),
              HasSubstr("more cells than its 2 writers"));
  EXPECT_THAT(fails([](auto& j) { j["arrays"][0].erase("writers"); }),
              HasSubstr("missing field 'writers'"));
  EXPECT_THAT(fails([](auto& j) { j["arrays"][0]["grid"] = 3; }), HasSubstr("malformed"));
  EXPECT_THAT(fails([](auto& j) {
                j["arrays"][0]["grid"][0] = {0, "2", 4};
              }),
              HasSubstr("malformed"));
  EXPECT_THAT(fails([](auto& j) { j.erase("index"); }), HasSubstr("missing field 'index'"));
  EXPECT_THAT(fails([](auto& j) { j["index"]["file"] = "../x"; }),
              HasSubstr("unexpected index file '../x'"));
  EXPECT_THAT(fails([](auto& j) { j["index"]["checksum"] = "x"; }),
              HasSubstr("bad index checksum 'x'"));
}

TEST(StepIndex, EachRankReadsOnlyTheRecordsItNeedsEachChecked) {
  TempDir dir;
  const std::string path = dir.path + "/index.bin";
  io::Marker saved = SampleMarkerV3();
  WriteIndex(&saved, path);
  auto m = io::ParseMarker(io::MarkerToJson(saved), "m.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto layout = io::IndexLayout::Of(*m, "x");
  ASSERT_TRUE(layout.ok());
  const std::vector<io::BoxRef> want{{2, 1}, {0, 1}};
  ASSERT_TRUE(io::LoadIndexRecords(path, *layout, want, &*m).ok());
  EXPECT_EQ(m->arrays[0].boxes[1].checksum, saved.arrays[0].boxes[1].checksum);
  EXPECT_EQ(m->arrays[0].boxes[1].chunks, saved.arrays[0].boxes[1].chunks);
  EXPECT_EQ(m->arrays[2].boxes[1].chunks, saved.arrays[2].boxes[1].chunks);
  EXPECT_TRUE(m->arrays[0].boxes[0].chunks.empty());  // not asked for, not read
  EXPECT_TRUE(m->arrays[1].boxes[0].chunks.empty());
  // The whole index, with its checksum: what verify reads.
  io::Marker all = *m;
  ASSERT_TRUE(io::LoadIndex(path, &all).ok());
  for (size_t a = 0; a < all.arrays.size(); ++a) {
    for (size_t b = 0; b < all.arrays[a].boxes.size(); ++b) {
      EXPECT_EQ(all.arrays[a].boxes[b].checksum, saved.arrays[a].boxes[b].checksum);
      EXPECT_EQ(all.arrays[a].boxes[b].chunks, saved.arrays[a].boxes[b].chunks);
    }
  }
}

// Subfiles: "files" in the marker, and each record ends in its box's place,
// which a reader takes only inside the step's subfiles.
TEST(StepIndex, WithSubfilesEachRecordHoldsItsBoxsPlace) {
  TempDir dir;
  const std::string path = dir.path + "/index.bin";
  io::Marker saved = SampleMarkerV3();
  saved.files = 2;
  const uint64_t placed = io::IndexLayout::Of(saved, "x")->total();
  WriteIndex(&saved, path);
  const std::string text = io::MarkerToJson(saved);
  EXPECT_EQ(nlohmann::json::parse(text)["files"], 2);
  auto m = io::ParseMarker(text, "m.json");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->files, 2);
  size_t boxes = 0;
  for (const io::MarkerArray& a : saved.arrays) boxes += a.boxes.size();
  io::Marker one = saved;
  one.files = 0;
  EXPECT_EQ(placed, io::IndexLayout::Of(one, "x")->total() + 16 * boxes);  // 16 bytes a place
  io::Marker all = *m;
  ASSERT_TRUE(io::LoadIndex(path, &all).ok());
  for (size_t a = 0; a < all.arrays.size(); ++a) {
    for (size_t b = 0; b < all.arrays[a].boxes.size(); ++b) {
      EXPECT_EQ(all.arrays[a].boxes[b].file, saved.arrays[a].boxes[b].file);
      EXPECT_EQ(all.arrays[a].boxes[b].file_offset, saved.arrays[a].boxes[b].file_offset);
      EXPECT_EQ(all.arrays[a].boxes[b].chunks, saved.arrays[a].boxes[b].chunks);
    }
  }
  // A record placing its box in a subfile the step does not have: refused,
  // though its check word matches.
  auto layout = io::IndexLayout::Of(saved, "x");
  ASSERT_TRUE(layout.ok());
  std::string bytes = ReadFile(path);
  std::string forged;
  const io::MarkerBox& fb = saved.arrays[2].boxes[1];
  io::AppendIndexRecord(2, 1, fb.checksum, fb.chunks, &forged, io::BoxPlace{7, 0});
  ASSERT_EQ(forged.size(), layout->record_bytes(2, 1));
  bytes.replace(layout->offset(2, 1), forged.size(), forged);
  ASSERT_TRUE(WriteFile(path, bytes));
  const std::vector<io::BoxRef> want{{2, 1}};
  io::Marker reader = *io::ParseMarker(io::MarkerToJson(saved), "m.json");
  Status s = io::LoadIndexRecords(path, *layout, want, &reader);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("array 'c' box [1:4, 0:1] (written by rank 0) is placed at "
                                     "byte 0 of subfile 7 of 2"));
  // Subfiles need version 3, and at most one per rank.
  io::Marker v2 = saved;
  io::PlanChunks(&v2, v2.chunk_bytes, 2);
  EXPECT_THAT(io::CheckMarker(v2, "x").message(), HasSubstr("subfiles"));
  io::Marker many = saved;
  many.files = many.world_size + 1;
  EXPECT_THAT(io::CheckMarker(many, "x").message(), HasSubstr("subfiles for a world of"));
}

TEST(StepIndex, DamageIsDataLossNamingTheFileArrayAndBox) {
  TempDir dir;
  const std::string path = dir.path + "/index.bin";
  io::Marker saved = SampleMarkerV3();
  WriteIndex(&saved, path);
  const std::string good = ReadFile(path);
  auto layout = io::IndexLayout::Of(saved, "x");
  auto load = [&](const std::string& bytes, io::BoxRef box) {
    EXPECT_TRUE(WriteFile(path, bytes));
    io::Marker m = *io::ParseMarker(io::MarkerToJson(saved), "m.json");
    const std::vector<io::BoxRef> want{box};
    Status s = io::LoadIndexRecords(path, *layout, want, &m);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    return s.message();
  };
  std::string flipped = good;
  flipped[layout->offset(2, 1) + 3] ^= 1;
  EXPECT_THAT(load(flipped, {2, 1}),
              HasSubstr("the record of array 'c' box [1:4, 0:1] (written by rank 0) fails its "
                        "check"));
  // Two records of the same size swapped: each fails, tied to its place.
  std::string swapped = good;
  const uint64_t a = layout->offset(0, 0), b = layout->offset(0, 1);
  ASSERT_EQ(layout->record_bytes(0, 0), layout->record_bytes(0, 1));
  std::swap_ranges(swapped.begin() + static_cast<std::ptrdiff_t>(a),
                   swapped.begin() + static_cast<std::ptrdiff_t>(b),
                   swapped.begin() + static_cast<std::ptrdiff_t>(b));
  EXPECT_THAT(load(swapped, {0, 1}), HasSubstr("array 'a' box [2:4, 0:2]"));
  EXPECT_THAT(load(good.substr(0, layout->offset(2, 2)), {2, 2}), HasSubstr("ends at byte"));
  std::string other_step = good;
  other_step[8] ^= 1;
  EXPECT_THAT(load(other_step, {0, 0}), HasSubstr("is not the index of step 7"));
  // verify's whole read: the size, and the checksum over every record.
  EXPECT_TRUE(WriteFile(path, good + "x"));
  io::Marker m = *io::ParseMarker(io::MarkerToJson(saved), "m.json");
  EXPECT_THAT(io::LoadIndex(path, &m).message(), HasSubstr("the commit marker says"));
  EXPECT_TRUE(WriteFile(path, good));
  m.index.checksum ^= 1;
  EXPECT_THAT(io::LoadIndex(path, &m).message(), HasSubstr("its records' checksum is"));
  EXPECT_TRUE(std::filesystem::remove(path));
  EXPECT_THAT(io::LoadIndex(path, &m).message(), HasSubstr("is missing"));
}

// The optional preemption record (CheckpointManager::ReachedPreemption's
// step): written in its sorted place in versions 2 and 3, parsed back, absent
// when not set, strict about its types when present.
TEST(Marker, PreemptionRecordIsOptionalAndStrictWhenPresent) {
  io::Marker v3 = SampleMarkerV3();
  v3.index.bytes = io::IndexLayout::Of(v3, "x")->total();
  for (io::Marker m : {SampleMarker(), v3}) {
    SCOPED_TRACE(m.format_version);
    auto plain = io::ParseMarker(io::MarkerToJson(m), "x");
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    EXPECT_FALSE(plain->preemption.has_value());
    EXPECT_EQ(io::MarkerToJson(m).find("preemption"), std::string::npos);
    m.preemption = io::MarkerPreemption{1'700'000'000'123, 90'000, 4'250};
    const std::string text = io::MarkerToJson(m);
    // The text nlohmann's dump gives: keys sorted.
    EXPECT_EQ(text, nlohmann::json::parse(text).dump() + "\n");
    auto parsed = io::ParseMarker(text, "x");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    ASSERT_TRUE(parsed->preemption.has_value());
    EXPECT_EQ(parsed->preemption->notice_unix_ms, 1'700'000'000'123);
    EXPECT_EQ(parsed->preemption->grace_ms, 90'000);
    EXPECT_EQ(parsed->preemption->saved_after_ms, 4'250);
    EXPECT_EQ(io::MarkerToJson(*parsed), text);
    // Damage: a missing field, a float, a string, an object that is not one,
    // a negative grace period.
    for (const char* bad : {R"({"grace_ms":1,"notice_unix_ms":2})",
                            R"({"grace_ms":1.5,"notice_unix_ms":2,"saved_after_ms":3})",
                            R"({"grace_ms":1,"notice_unix_ms":"2","saved_after_ms":3})", "true",
                            R"({"grace_ms":-1,"notice_unix_ms":2,"saved_after_ms":3})"}) {
      nlohmann::json j = nlohmann::json::parse(text);
      j["preemption"] = nlohmann::json::parse(bad);
      Result<io::Marker> r = io::ParseMarker(j.dump(), "x");
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << bad;
      EXPECT_THAT(r.status().message(), HasSubstr("preemption")) << bad;
    }
  }
}

}  // namespace
}  // namespace mhckpt
