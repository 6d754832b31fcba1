// MarkerToJson (io/marker.h): the commit marker's JSON text, versions 1 to 3.
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "io/layout.h"
#include "io/marker.h"

namespace mhckpt::io {
namespace {

using nlohmann::json;

}  // namespace

namespace {

void AppendInts(std::string& out, const std::vector<int64_t>& v) {
  out += '[';
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ',';
    fmt::format_to(std::back_inserter(out), "{}", v[i]);
  }
  out += ']';
}

// A JSON string, escaped as nlohmann::json::dump escapes it.
void AppendString(std::string& out, const std::string& s) { out += json(s).dump(); }

// The optional preemption record, as a key after "format_version" and
// "index" and before "step" (keys sorted).
void AppendPreemption(std::string& out, const Marker& m) {
  if (!m.preemption) return;
  fmt::format_to(std::back_inserter(out),
                 ",\"preemption\":{{\"grace_ms\":{},\"notice_unix_ms\":{},\"saved_after_ms\":{}}}",
                 m.preemption->grace_ms, m.preemption->notice_unix_ms,
                 m.preemption->saved_after_ms);
}

}  // namespace

// Written directly rather than through a json DOM: a marker of 10,000 arrays
// is ~100,000 JSON values, and building, dumping and freeing them cost more
// than the rest of the commit (docs/PERFORMANCE.md, "Many small arrays"). The
// text is the one nlohmann::json::dump gives (keys sorted, one line).
namespace {

// Version 3: one array, its boxes as a grid when they are one.
void AppendArrayV3(std::string& out, const MarkerArray& a) {
  const std::optional<std::vector<std::vector<int64_t>>> grid = GridCuts(a);
  out += '{';
  if (!grid) {
    out += "\"boxes\":[";
    for (size_t k = 0; k < a.boxes.size(); ++k) {
      const MarkerBox& b = a.boxes[k];
      out += k > 0 ? ",{\"count\":" : "{\"count\":";
      AppendInts(out, b.box.count);
      out += ",\"start\":";
      AppendInts(out, b.box.start);
      fmt::format_to(std::back_inserter(out), ",\"writer\":{}}}", b.writer);
    }
    out += "],";
  }
  out += "\"dtype\":";
  AppendString(out, std::string(DTypeName(a.dtype)));
  if (grid) {
    out += ",\"grid\":[";
    for (size_t d = 0; d < grid->size(); ++d) {
      if (d > 0) out += ',';
      AppendInts(out, (*grid)[d]);
    }
    out += ']';
  }
  out += ",\"name\":";
  AppendString(out, a.name);
  fmt::format_to(std::back_inserter(out), ",\"offset\":{}", a.offset);
  out += a.replicated ? ",\"replicated\":true,\"shape\":" : ",\"replicated\":false,\"shape\":";
  AppendInts(out, a.shape);
  if (grid) {
    out += ",\"writers\":[";
    for (size_t k = 0; k < a.boxes.size(); ++k) {
      if (k > 0) out += ',';
      fmt::format_to(std::back_inserter(out), "{}", a.boxes[k].writer);
    }
    out += ']';
  }
  out += '}';
}

std::string MarkerToJsonV3(const Marker& m) {
  std::string out;
  out.reserve(256 + m.arrays.size() * 160);
  out += "{\"arrays\":[";
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (i > 0) out += ',';
    AppendArrayV3(out, m.arrays[i]);
  }
  fmt::format_to(std::back_inserter(out),
                 "],\"chunk_bytes\":{},\"created_unix_ms\":{},\"data_file\":", m.chunk_bytes,
                 m.created_unix_ms);
  AppendString(out, m.data_file);
  if (m.files > 0) fmt::format_to(std::back_inserter(out), ",\"files\":{}", m.files);
  fmt::format_to(std::back_inserter(out),
                 ",\"format\":\"mhckpt\",\"format_version\":{},\"index\":{{\"bytes\":{},"
                 "\"checksum\":\"{}\",\"file\":\"{}\"}}",
                 m.format_version, m.index.bytes, ChecksumToString(m.index.checksum),
                 kIndexFileName);
  AppendPreemption(out, m);
  fmt::format_to(std::back_inserter(out),
                 ",\"step\":{},\"total_bytes\":{},\"user_metadata\":", m.step, m.total_bytes);
  out += json(m.user_metadata).dump();
  fmt::format_to(std::back_inserter(out), ",\"world_size\":{}}}\n", m.world_size);
  return out;
}

}  // namespace

std::string MarkerToJson(const Marker& m, MarkerText what) {
  if (m.format_version >= 3) return MarkerToJsonV3(m);
  const bool chunked = m.format_version >= 2;
  const bool chunk_lists = chunked && what == MarkerText::kCommit;
  std::string out;
  out.reserve(256 + m.arrays.size() * 160);
  out += "{\"arrays\":[";
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const MarkerArray& a = m.arrays[i];
    if (i > 0) out += ',';
    out += "{\"boxes\":[";
    for (size_t k = 0; k < a.boxes.size(); ++k) {
      const MarkerBox& b = a.boxes[k];
      if (k > 0) out += ',';
      out += "{\"checksum\":";
      AppendString(out, ChecksumToString(b.checksum));
      if (chunk_lists) {
        fmt::format_to(std::back_inserter(out), ",\"chunk_rows\":{},\"chunks\":[", b.chunk_rows);
        for (size_t c = 0; c < b.chunks.size(); ++c) {
          if (c > 0) out += ',';
          fmt::format_to(std::back_inserter(out), "\"xxh3:{:016x}\"", b.chunks[c]);
        }
        out += ']';
      }
      out += ",\"count\":";
      AppendInts(out, b.box.count);
      out += ",\"start\":";
      AppendInts(out, b.box.start);
      fmt::format_to(std::back_inserter(out), ",\"writer\":{}}}", b.writer);
    }
    out += "],\"dtype\":";
    AppendString(out, std::string(DTypeName(a.dtype)));
    out += ",\"name\":";
    AppendString(out, a.name);
    if (chunked) fmt::format_to(std::back_inserter(out), ",\"offset\":{}", a.offset);
    out += a.replicated ? ",\"replicated\":true,\"shape\":" : ",\"replicated\":false,\"shape\":";
    AppendInts(out, a.shape);
    out += '}';
  }
  out += ']';
  if (chunked) fmt::format_to(std::back_inserter(out), ",\"chunk_bytes\":{}", m.chunk_bytes);
  fmt::format_to(std::back_inserter(out),
                 ",\"created_unix_ms\":{},\"data_file\":", m.created_unix_ms);
  AppendString(out, m.data_file);
  fmt::format_to(std::back_inserter(out), ",\"format\":\"mhckpt\",\"format_version\":{}",
                 m.format_version);
  AppendPreemption(out, m);
  fmt::format_to(std::back_inserter(out),
                 ",\"step\":{},\"total_bytes\":{},\"user_metadata\":", m.step, m.total_bytes);
  out += json(m.user_metadata).dump();
  fmt::format_to(std::back_inserter(out), ",\"world_size\":{}}}\n", m.world_size);
  return out;  // one line: markers of 10k arrays stay small
}

}  // namespace mhckpt::io
