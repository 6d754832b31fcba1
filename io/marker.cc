#include "io/marker.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::io {
namespace {

using nlohmann::json;

json BoxJson(const Box& b) { return json{{"start", b.start}, {"count", b.count}}; }

// An integer field, refusing what nlohmann would silently convert: floats,
// booleans, and values outside T. Throws json::type_error (ParseMarker turns
// it into DataLoss).
template <typename T>
T Int(const json& j) {
  bool fits = false;
  if (j.is_number_unsigned()) {  // nlohmann keeps every non-negative integer here
    fits = j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  } else if (j.is_number_integer()) {  // negative
    fits = std::numeric_limits<T>::is_signed &&
           j.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min());
  }
  if (!fits)
    throw json::type_error::create(302, "expected an integer in range, got " + j.dump(), &j);
  return j.get<T>();
}

std::vector<int64_t> Ints(const json& j) {
  if (!j.is_array()) throw json::type_error::create(302, "expected an array of integers", &j);
  std::vector<int64_t> out;
  for (const json& e : j) out.push_back(Int<int64_t>(e));
  return out;
}

// Throws json exceptions on wrong types; ParseMarker turns them into DataLoss.
Box BoxFromJson(const json& j) { return Box{Ints(j.at("start")), Ints(j.at("count"))}; }

Status Validate(const Marker& m, const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return DataLoss(fmt::format("commit marker '{}': {}", origin, what));
  };
  if (m.format_version != kFormatVersion) {
    return bad(fmt::format("unknown format version {} (this build reads {})", m.format_version,
                           kFormatVersion));
  }
  if (m.step < 0) return bad(fmt::format("negative step {}", m.step));
  if (m.world_size < 1) return bad(fmt::format("world size {} is not positive", m.world_size));
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const MarkerArray& a = m.arrays[i];
    if (std::string why = CheckArrayName(a.name); !why.empty()) {
      return bad(fmt::format("array '{}': bad name: {}", a.name, why));
    }
    if (i > 0 && !(m.arrays[i - 1].name < a.name)) {
      return bad(fmt::format("array '{}': arrays are not sorted and unique", a.name));
    }
    if (a.shape.size() > 32) return bad(fmt::format("array '{}': more than 32 dimensions", a.name));
    if (!Volume(a.shape)) {
      return bad(fmt::format("array '{}': invalid shape {}", a.name, ShapeToString(a.shape)));
    }
    for (const MarkerBox& b : a.boxes) {
      if (std::string why = CheckBoxInShape(b.box, a.shape); !why.empty()) {
        return bad(fmt::format("array '{}' box {}: {}", a.name, BoxToString(b.box), why));
      }
      if (b.writer < 0 || b.writer >= m.world_size) {
        return bad(fmt::format("array '{}' box {}: writer rank {} outside world size {}", a.name,
                               BoxToString(b.box), b.writer, m.world_size));
      }
    }
  }
  return OkStatus();
}

}  // namespace

const MarkerArray* Marker::Find(const std::string& name) const {
  auto it = std::lower_bound(arrays.begin(), arrays.end(), name,
                             [](const MarkerArray& a, const std::string& n) { return a.name < n; });
  return it != arrays.end() && it->name == name ? &*it : nullptr;
}

std::string MarkerToJson(const Marker& m) {
  json arrays = json::array();
  for (const MarkerArray& a : m.arrays) {
    json boxes = json::array();
    for (const MarkerBox& b : a.boxes) {
      json jb = BoxJson(b.box);
      jb["writer"] = b.writer;
      jb["checksum"] = ChecksumToString(b.checksum);
      boxes.push_back(std::move(jb));
    }
    arrays.push_back(json{{"name", a.name},
                          {"dtype", std::string(DTypeName(a.dtype))},
                          {"shape", a.shape},
                          {"replicated", a.replicated},
                          {"boxes", std::move(boxes)}});
  }
  json j{{"format", "mhckpt"},
         {"format_version", m.format_version},
         {"step", m.step},
         {"world_size", m.world_size},
         {"created_unix_ms", m.created_unix_ms},
         {"data_file", m.data_file},
         {"total_bytes", m.total_bytes},
         {"user_metadata", m.user_metadata},
         {"arrays", std::move(arrays)}};
  return j.dump() + "\n";  // one line: markers of 10k arrays stay small
}

Result<Marker> ParseMarker(const std::string& text, const std::string& origin) {
  Marker m;
  try {
    json j = json::parse(text);
    if (j.at("format").get<std::string>() != "mhckpt") {
      return DataLoss(fmt::format("commit marker '{}': not an mhckpt marker", origin));
    }
    m.format_version = Int<int>(j.at("format_version"));
    if (m.format_version != kFormatVersion) return Validate(m, origin);
    m.step = Int<int64_t>(j.at("step"));
    m.world_size = Int<int>(j.at("world_size"));
    m.created_unix_ms = Int<int64_t>(j.at("created_unix_ms"));
    m.data_file = j.at("data_file").get<std::string>();
    m.total_bytes = Int<uint64_t>(j.at("total_bytes"));
    m.user_metadata = j.at("user_metadata").get<std::map<std::string, std::string>>();
    for (const json& ja : j.at("arrays")) {
      MarkerArray a;
      a.name = ja.at("name").get<std::string>();
      auto dtype = DTypeFromName(ja.at("dtype").get<std::string>());
      if (!dtype) {
        return DataLoss(fmt::format("commit marker '{}': array '{}': unknown dtype '{}'", origin,
                                    a.name, ja.at("dtype").get<std::string>()));
      }
      a.dtype = *dtype;
      a.shape = Ints(ja.at("shape"));
      a.replicated = ja.at("replicated").get<bool>();
      for (const json& jb : ja.at("boxes")) {
        std::string sum = jb.at("checksum").get<std::string>();
        auto checksum = ChecksumFromString(sum);
        if (!checksum) {
          return DataLoss(fmt::format("commit marker '{}': array '{}': bad checksum '{}'", origin,
                                      a.name, sum));
        }
        a.boxes.push_back(MarkerBox{BoxFromJson(jb), Int<int>(jb.at("writer")), *checksum});
      }
      m.arrays.push_back(std::move(a));
    }
  } catch (const json::exception& e) {
    return DataLoss(fmt::format("commit marker '{}' is malformed: {}", origin, e.what()));
  }
  if (m.data_file != kDataFileName) {
    return DataLoss(
        fmt::format("commit marker '{}': unexpected data file '{}'", origin, m.data_file));
  }
  MHCKPT_RETURN_IF_ERROR(Validate(m, origin));
  return m;
}

Result<Marker> ReadMarker(const std::string& path) {
  MHCKPT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxMarkerBytes));
  return ParseMarker(text, path);
}

}  // namespace mhckpt::io
