// libFuzzer target for the commit-marker parser (io::ParseMarker), the gate
// every committed step passes through. Beyond "no crash, no sanitizer report"
// it checks what docs/FORMAT.md promises of a marker that parses:
//   - a refusal is DataLoss and names the marker;
//   - an accepted marker is valid: versions 1-3, step >= 0, world size >= 1,
//     names valid, sorted and unique, shapes with fewer than 2^62 elements,
//     every box inside its shape, writers inside the world size; version 3:
//     no checksums in it, and the index size its boxes' records take;
//   - nothing is lost or reinterpreted: every field the parser read has the
//     same JSON value in the input and in MarkerToJson of the result (so a
//     float, a boolean or an out-of-range integer cannot pass for an int);
//   - MarkerToJson of the result parses back to the same text;
//   - the optional preemption record is kept as read, its grace period not
//     negative.
// A violated property aborts with a message, which libFuzzer reports as a
// crash and saves the input.
//
// Known, reported library bugs can be tolerated while they are open, so that a
// fuzz run still finds new ones: MHCKPT_FUZZ_KNOWN_BUGS="lossless" skips the
// lossless property (and fuzz/known_bugs.supp holds UBSan suppressions; both
// are empty now, see fuzz/run.sh and docs/TESTING.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "base/types.h"
#include "io/marker.h"
#include "io/step_index.h"

namespace {

using mhckpt::io::Marker;
using nlohmann::json;

bool Tolerated(const char* bug) {
  static const std::string known = [] {
    const char* k = std::getenv("MHCKPT_FUZZ_KNOWN_BUGS");
    return std::string(k ? k : "");
  }();
  return known.find(bug) != std::string::npos;
}

[[noreturn]] void Fail(const std::string& what, const std::string& input) {
  std::fprintf(stderr, "marker_fuzzer: property violated: %s\ninput: %.2000s\n", what.c_str(),
               input.c_str());
  std::abort();
}

void CheckValid(const Marker& m, const std::string& input) {
  if (m.format_version < mhckpt::io::kOldestFormatVersion ||
      m.format_version > mhckpt::io::kFormatVersion) {
    Fail("accepted another version", input);
  }
  const bool chunked = m.format_version >= 2;
  if (chunked && m.chunk_bytes == 0) Fail("accepted chunk size 0", input);
  if (m.step < 0) Fail("accepted a negative step", input);
  if (m.world_size < 1) Fail("accepted a world size below 1", input);
  if (m.files < 0 || m.files > m.world_size || (m.files > 0 && m.format_version < 3)) {
    Fail("accepted subfiles outside 1 to the world size, or before version 3", input);
  }
  if (m.preemption && m.preemption->grace_ms < 0) Fail("accepted a negative grace period", input);
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const auto& a = m.arrays[i];
    if (!mhckpt::CheckArrayName(a.name).empty()) Fail("accepted a bad name", input);
    if (i > 0 && !(m.arrays[i - 1].name < a.name)) Fail("accepted unsorted arrays", input);
    if (!mhckpt::IsValidDType(a.dtype)) Fail("accepted an invalid dtype", input);
    auto volume = mhckpt::Volume(a.shape);
    if (!volume || *volume >= (int64_t{1} << 62) + 1) Fail("accepted a huge shape", input);
    if (m.Find(a.name) != &a) Fail("Find does not find an accepted array", input);
    for (const auto& b : a.boxes) {
      if (!mhckpt::CheckBoxInShape(b.box, a.shape).empty()) Fail("accepted a box outside", input);
      if (b.writer < 0 || b.writer >= m.world_size) Fail("accepted a writer outside", input);
      // Version 3 keeps the checksums in the index: none in the marker.
      if (m.format_version >= 3 && (!b.chunks.empty() || b.checksum != 0)) {
        Fail("a version-3 marker with checksums", input);
      }
      if (chunked && (b.chunk_rows < 1 ||
                      (m.format_version < 3 && static_cast<int64_t>(b.chunks.size()) !=
                                                   mhckpt::io::ChunkCount(b.box, b.chunk_rows)))) {
        Fail("accepted chunks that do not cover the box", input);
      }
    }
    if (chunked && a.offset < -1) Fail("accepted a negative offset", input);
  }
  // Version 3: the index the marker records has the size its boxes' records
  // take (io/step_index.h).
  if (m.format_version >= 3) {
    auto layout = mhckpt::io::IndexLayout::Of(m, "fuzz");
    if (!layout.ok() || layout->total() != m.index.bytes) {
      Fail("accepted an index size that its boxes do not take", input);
    }
  }
}

// The boxes of a marker's array (JSON): version 3 may write them as a grid
// ("grid": the cuts of each dimension, "writers": one per cell, row-major).
json Boxes(const json& a) {
  if (a.contains("boxes")) return a.at("boxes");
  const json& grid = a.at("grid");
  json boxes = json::array();
  std::vector<size_t> cell(grid.size(), 0);
  for (const json& writer : a.at("writers")) {
    json start = json::array(), count = json::array();
    for (size_t d = 0; d < grid.size(); ++d) {
      start.push_back(grid[d][cell[d]]);
      count.push_back(grid[d][cell[d] + 1].get<int64_t>() - grid[d][cell[d]].get<int64_t>());
    }
    boxes.push_back({{"count", count}, {"start", start}, {"writer", writer}});
    for (size_t d = grid.size(); d > 0 && ++cell[d - 1] + 1 >= grid[d - 1].size(); --d) {
      cell[d - 1] = 0;
    }
  }
  return boxes;
}

// The fields ParseMarker reads must come out of MarkerToJson with the same
// JSON value they went in with.
void CheckLossless(const json& in, const json& out, const std::string& input) {
  for (const char* k : {"format", "format_version", "step", "world_size", "created_unix_ms",
                        "data_file", "total_bytes", "user_metadata"}) {
    if (in.at(k) != out.at(k)) Fail(std::string("field '") + k + "' changed in parsing", input);
  }
  if (in.at("format_version") == 3) {
    if (in.value("files", 0) != out.value("files", 0)) Fail("field 'files' changed", input);
    for (const char* k : {"bytes", "checksum", "file"}) {
      if (in.at("index").at(k) != out.at("index").at(k)) {
        Fail(std::string("index field '") + k + "' changed in parsing", input);
      }
    }
  }
  // The optional preemption record: there in both or in neither, its fields unchanged.
  if (in.contains("preemption") != out.contains("preemption")) {
    Fail("the preemption record appeared or vanished", input);
  }
  if (in.contains("preemption")) {
    for (const char* k : {"notice_unix_ms", "grace_ms", "saved_after_ms"}) {
      if (in.at("preemption").at(k) != out.at("preemption").at(k)) {
        Fail(std::string("preemption field '") + k + "' changed in parsing", input);
      }
    }
  }
  const json& ia = in.at("arrays");
  const json& oa = out.at("arrays");
  if (ia.size() != oa.size()) Fail("array count changed", input);
  for (size_t i = 0; i < ia.size(); ++i) {
    for (const char* k : {"name", "dtype", "shape", "replicated"}) {
      if (ia[i].at(k) != oa[i].at(k)) Fail(std::string("array field '") + k + "' changed", input);
    }
    const json ib = Boxes(ia[i]);
    const json ob = Boxes(oa[i]);
    if (ib.size() != ob.size()) Fail("box count changed", input);
    for (size_t j = 0; j < ib.size(); ++j) {
      for (const char* k : {"start", "count", "writer"}) {
        if (ib[j].at(k) != ob[j].at(k)) Fail(std::string("box field '") + k + "' changed", input);
      }
      if (in.at("format_version") == 2 && ib[j].at("chunk_rows") != ob[j].at("chunk_rows")) {
        Fail("box field 'chunk_rows' changed", input);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  mhckpt::Result<Marker> m = mhckpt::io::ParseMarker(input, "fuzz/commit.json");
  if (!m.ok()) {
    if (m.status().code() != mhckpt::StatusCode::kDataLoss) Fail("refusal is not DataLoss", input);
    if (m.status().message().find("fuzz/commit.json") == std::string::npos) {
      Fail("refusal does not name the marker", input);
    }
    return 0;
  }
  CheckValid(*m, input);
  const std::string text = mhckpt::io::MarkerToJson(*m);
  if (!Tolerated("lossless")) CheckLossless(json::parse(input), json::parse(text), input);
  mhckpt::Result<Marker> again = mhckpt::io::ParseMarker(text, "fuzz/again.json");
  if (!again.ok()) Fail("MarkerToJson output does not parse: " + again.status().ToString(), input);
  if (mhckpt::io::MarkerToJson(*again) != text) Fail("round trip is not stable", input);
  return 0;
}
