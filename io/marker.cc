#include "io/marker.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/checksum.h"
#include "io/layout.h"
#include "io/posix_file.h"
#include "io/step_index.h"

namespace mhckpt::io {
namespace {

using nlohmann::json;

// ---- Parsing ----
//
// A marker of 10,000 arrays is ~1.7 MB of JSON, ~150,000 values. Parsed into
// a nlohmann DOM and then copied into a Marker, it cost ~40 ms alone and
// 0.1-0.3 s inside a busy process (one std::map node per key, freed again):
// a quarter of a restore. So the parser below takes nlohmann's SAX events and
// fills the Marker directly (docs/PERFORMANCE.md, "Many small arrays").
// It is as strict as the DOM reading it replaces: every field must be present
// and of its type, integers must be integers in range (no floats, booleans or
// wider values), unknown keys are ignored, a repeated key counts once (the
// last). Fields are checked after the parse, in a fixed order, so a damaged
// marker gives the same error whatever the order of its keys.

// One field as read: missing, of the right type, or not.
enum class SlotState : uint8_t { kMissing, kOk, kBad };

template <typename T>
struct Slot {
  SlotState state = SlotState::kMissing;
  T value{};
  void Set(T v) {
    state = SlotState::kOk;
    value = std::move(v);
  }
  void Bad() {
    state = SlotState::kBad;
    value = T{};
  }
  [[nodiscard]] bool ok() const { return state == SlotState::kOk; }
};

// A JSON number as read; `kind` says which member holds it.
struct Num {
  enum Kind : uint8_t { kUnsigned, kNegative } kind = kUnsigned;
  uint64_t u = 0;
  int64_t i = 0;
};

struct BoxSlots {
  Slot<std::string> checksum;
  Slot<std::vector<int64_t>> start, count;
  Slot<Num> writer, chunk_rows;
  Slot<std::vector<std::string>> chunks;
};

struct ArraySlots {
  Slot<std::string> name, dtype;
  Slot<std::vector<int64_t>> shape, writers;
  Slot<std::vector<Slot<std::vector<int64_t>>>> grid;
  Slot<bool> replicated;
  Slot<std::vector<BoxSlots>> boxes;
  Slot<Num> offset;
};

struct MarkerSlots {
  bool is_object = false;
  Slot<std::string> format, data_file, index_file, index_checksum;
  Slot<Num> format_version, step, world_size, created_unix_ms, total_bytes, chunk_bytes,
      index_bytes, files;
  Slot<bool> index;  // the "index" object was there
  Slot<std::map<std::string, std::string>> user_metadata;
  Slot<std::vector<ArraySlots>> arrays;
};

// Thrown (and caught in ParseMarker) for a field missing or of a wrong type.
struct Malformed {
  std::string why;
};

template <typename T>
const T& Need(const Slot<T>& s, const char* field) {
  if (s.state == SlotState::kMissing) throw Malformed{fmt::format("missing field '{}'", field)};
  if (s.state == SlotState::kBad)
    throw Malformed{fmt::format("field '{}' has a wrong type", field)};
  return s.value;
}

// An integer of type T, refusing values outside it.
template <typename T>
T NeedInt(const Slot<Num>& s, const char* field) {
  const Num& n = Need(s, field);
  bool fits = n.kind == Num::kUnsigned
                  ? n.u <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                  : std::numeric_limits<T>::is_signed &&
                        n.i >= static_cast<int64_t>(std::numeric_limits<T>::min());
  if (!fits) throw Malformed{fmt::format("field '{}': integer out of range", field)};
  return n.kind == Num::kUnsigned ? static_cast<T>(n.u) : static_cast<T>(n.i);
}

class MarkerSax final : public nlohmann::json_sax<json> {
 public:
  explicit MarkerSax(MarkerSlots* out) : out_(out) {}

  bool null() override { return Scalar(Value::kOther); }
  bool boolean(bool v) override {
    bool_ = v;
    return Scalar(Value::kBool);
  }
  bool number_integer(number_integer_t v) override {
    num_ = Num{Num::kNegative, 0, v};
    return Scalar(Value::kNumber);
  }
  bool number_unsigned(number_unsigned_t v) override {
    num_ = Num{Num::kUnsigned, v, 0};
    return Scalar(Value::kNumber);
  }
  bool number_float(number_float_t /*v*/, const string_t& /*s*/) override {
    return Scalar(Value::kOther);
  }
  bool string(string_t& v) override {
    str_ = &v;  // moved from by Set: the lexer clears it before the next token
    return Scalar(Value::kString);
  }
  bool binary(binary_t& /*v*/) override { return Scalar(Value::kOther); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t /*n*/) override {
    Frame& f = Top();
    switch (f.kind) {
      case Kind::kRoot:
        out_->is_object = true;
        Push(Kind::kTop);
        return true;
      case Kind::kTop:
        if (key_ == "user_metadata") {
          out_->user_metadata.Set({});
          Push(Kind::kUserMetadata);
          return true;
        }
        if (key_ == "index") {
          out_->index.Set(true);
          Push(Kind::kIndex);
          return true;
        }
        break;
      case Kind::kArrays:
        out_->arrays.value.emplace_back();
        array_ = &out_->arrays.value.back();
        Push(Kind::kArray);
        return true;
      case Kind::kBoxes:
        array_->boxes.value.emplace_back();
        box_ = &array_->boxes.value.back();
        Push(Kind::kBox);
        return true;
      default: break;
    }
    MarkWrong();
    Push(Kind::kSkip);
    return true;
  }
  bool end_object() override { return Pop(); }

  bool start_array(std::size_t /*n*/) override {
    Frame& f = Top();
    if (f.kind == Kind::kTop && key_ == "arrays") {
      out_->arrays.Set({});
      Push(Kind::kArrays);
      return true;
    }
    if (f.kind == Kind::kArray && key_ == "boxes") {
      array_->boxes.Set({});
      Push(Kind::kBoxes);
      return true;
    }
    if (f.kind == Kind::kArray && key_ == "grid") {
      array_->grid.Set({});
      Push(Kind::kGrid);
      return true;
    }
    if (f.kind == Kind::kGrid && array_->grid.ok()) {
      Slot<std::vector<int64_t>>& cuts = array_->grid.value.emplace_back();
      cuts.Set({});
      Push(Kind::kInts, &cuts);
      return true;
    }
    if (f.kind == Kind::kBox && key_ == "chunks") {
      box_->chunks.Set({});
      Push(Kind::kStrings, nullptr, &box_->chunks);
      return true;
    }
    if (Slot<std::vector<int64_t>>* ints = IntsSlot()) {
      ints->Set({});
      Push(Kind::kInts, ints);
      return true;
    }
    MarkWrong();
    Push(Kind::kSkip);
    return true;
  }
  bool end_array() override { return Pop(); }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  enum class Kind : uint8_t {
    kRoot,
    kTop,
    kUserMetadata,
    kArrays,
    kArray,
    kBoxes,
    kBox,
    kIndex,
    kGrid,
    kInts,
    kStrings,
    kSkip
  };
  enum class Value : uint8_t { kBool, kNumber, kString, kOther };
  struct Frame {
    Kind kind;
    Slot<std::vector<int64_t>>* ints = nullptr;      // kInts
    Slot<std::vector<std::string>>* strs = nullptr;  // kStrings
  };

  Frame& Top() { return stack_.back(); }
  void Push(Kind k, Slot<std::vector<int64_t>>* ints = nullptr,
            Slot<std::vector<std::string>>* strs = nullptr) {
    stack_.push_back({k, ints, strs});
  }
  bool Pop() {
    stack_.pop_back();
    return true;
  }

  // The integer-list field the current key names, or nullptr.
  Slot<std::vector<int64_t>>* IntsSlot() {
    Frame& f = Top();
    if (f.kind == Kind::kArray && key_ == "shape") return &array_->shape;
    if (f.kind == Kind::kArray && key_ == "writers") return &array_->writers;
    if (f.kind == Kind::kBox && key_ == "start") return &box_->start;
    if (f.kind == Kind::kBox && key_ == "count") return &box_->count;
    return nullptr;
  }

  // A value of the wrong kind (scalar or container) for the current key:
  // the field it would fill is bad.
  void MarkWrong() {
    Frame& f = Top();
    switch (f.kind) {
      case Kind::kTop:
        if (key_ == "format") out_->format.Bad();
        if (key_ == "data_file") out_->data_file.Bad();
        if (key_ == "format_version") out_->format_version.Bad();
        if (key_ == "step") out_->step.Bad();
        if (key_ == "world_size") out_->world_size.Bad();
        if (key_ == "created_unix_ms") out_->created_unix_ms.Bad();
        if (key_ == "total_bytes") out_->total_bytes.Bad();
        if (key_ == "chunk_bytes") out_->chunk_bytes.Bad();
        if (key_ == "files") out_->files.Bad();
        if (key_ == "user_metadata") out_->user_metadata.Bad();
        if (key_ == "arrays") out_->arrays.Bad();
        if (key_ == "index") out_->index.Bad();
        break;
      case Kind::kIndex:
        if (key_ == "file") out_->index_file.Bad();
        if (key_ == "bytes") out_->index_bytes.Bad();
        if (key_ == "checksum") out_->index_checksum.Bad();
        break;
      case Kind::kGrid: array_->grid.Bad(); break;
      case Kind::kUserMetadata: out_->user_metadata.Bad(); break;
      case Kind::kArrays: out_->arrays.Bad(); break;
      case Kind::kArray:
        if (key_ == "name") array_->name.Bad();
        if (key_ == "dtype") array_->dtype.Bad();
        if (key_ == "shape") array_->shape.Bad();
        if (key_ == "replicated") array_->replicated.Bad();
        if (key_ == "boxes") array_->boxes.Bad();
        if (key_ == "offset") array_->offset.Bad();
        if (key_ == "grid") array_->grid.Bad();
        if (key_ == "writers") array_->writers.Bad();
        break;
      case Kind::kBoxes: array_->boxes.Bad(); break;
      case Kind::kBox:
        if (key_ == "checksum") box_->checksum.Bad();
        if (key_ == "start") box_->start.Bad();
        if (key_ == "count") box_->count.Bad();
        if (key_ == "writer") box_->writer.Bad();
        if (key_ == "chunk_rows") box_->chunk_rows.Bad();
        if (key_ == "chunks") box_->chunks.Bad();
        break;
      case Kind::kInts: f.ints->Bad(); break;
      case Kind::kStrings: f.strs->Bad(); break;
      case Kind::kRoot:
      case Kind::kSkip: break;
    }
  }

  bool Scalar(Value v) {
    Frame& f = Top();
    switch (f.kind) {
      case Kind::kTop:
        if (v == Value::kString && key_ == "format")
          return out_->format.Set(std::move(*str_)), true;
        if (v == Value::kString && key_ == "data_file")
          return out_->data_file.Set(std::move(*str_)), true;
        if (v == Value::kNumber) {
          if (key_ == "format_version") return out_->format_version.Set(num_), true;
          if (key_ == "step") return out_->step.Set(num_), true;
          if (key_ == "world_size") return out_->world_size.Set(num_), true;
          if (key_ == "created_unix_ms") return out_->created_unix_ms.Set(num_), true;
          if (key_ == "total_bytes") return out_->total_bytes.Set(num_), true;
          if (key_ == "chunk_bytes") return out_->chunk_bytes.Set(num_), true;
          if (key_ == "files") return out_->files.Set(num_), true;
        }
        break;
      case Kind::kIndex:
        if (v == Value::kString && key_ == "file")
          return out_->index_file.Set(std::move(*str_)), true;
        if (v == Value::kString && key_ == "checksum")
          return out_->index_checksum.Set(std::move(*str_)), true;
        if (v == Value::kNumber && key_ == "bytes") return out_->index_bytes.Set(num_), true;
        break;
      case Kind::kUserMetadata:
        if (v == Value::kString && out_->user_metadata.ok()) {
          out_->user_metadata.value[key_] = std::move(*str_);
          return true;
        }
        break;
      case Kind::kArray:
        if (v == Value::kString && key_ == "name") return array_->name.Set(std::move(*str_)), true;
        if (v == Value::kString && key_ == "dtype")
          return array_->dtype.Set(std::move(*str_)), true;
        if (v == Value::kBool && key_ == "replicated") return array_->replicated.Set(bool_), true;
        if (v == Value::kNumber && key_ == "offset") return array_->offset.Set(num_), true;
        break;
      case Kind::kBox:
        if (v == Value::kString && key_ == "checksum")
          return box_->checksum.Set(std::move(*str_)), true;
        if (v == Value::kNumber && key_ == "writer") return box_->writer.Set(num_), true;
        if (v == Value::kNumber && key_ == "chunk_rows") return box_->chunk_rows.Set(num_), true;
        break;
      case Kind::kStrings:
        if (v == Value::kString && f.strs->ok()) {
          f.strs->value.push_back(std::move(*str_));
          return true;
        }
        break;
      case Kind::kInts:
        if (v == Value::kNumber && f.ints->ok()) {
          if (num_.kind == Num::kUnsigned &&
              num_.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            f.ints->Bad();
          } else {
            f.ints->value.push_back(num_.kind == Num::kUnsigned ? static_cast<int64_t>(num_.u)
                                                                : num_.i);
          }
          return true;
        }
        break;
      case Kind::kRoot:  // a scalar document: not an object
      case Kind::kGrid:
      case Kind::kArrays:
      case Kind::kBoxes:
      case Kind::kSkip: break;
    }
    MarkWrong();
    return true;
  }

  MarkerSlots* out_;
  std::vector<Frame> stack_{{Kind::kRoot}};
  std::string key_;
  ArraySlots* array_ = nullptr;
  BoxSlots* box_ = nullptr;
  // The last scalar.
  bool bool_ = false;
  Num num_;
  std::string* str_ = nullptr;
  std::string error_;
};

Status Validate(const Marker& m, const std::string& origin) {
  auto bad = [&](const std::string& what) {
    return DataLoss(fmt::format("commit marker '{}': {}", origin, what));
  };
  if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion) {
    return bad(fmt::format("unknown format version {} (this build reads {} to {})",
                           m.format_version, kOldestFormatVersion, kFormatVersion));
  }
  const bool chunked = m.format_version >= 2;
  if (chunked && m.chunk_bytes == 0) return bad("chunk size 0");
  if (m.step < 0) return bad(fmt::format("negative step {}", m.step));
  if (m.world_size < 1) return bad(fmt::format("world size {} is not positive", m.world_size));
  if (m.files < 0 || m.files > m.world_size || (m.files > 0 && m.format_version < 3)) {
    return bad(fmt::format("{} subfiles for a world of {} ranks at format version {}", m.files,
                           m.world_size, m.format_version));
  }
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const MarkerArray& a = m.arrays[i];
    if (std::string why = CheckArrayName(a.name); !why.empty()) {
      return bad(fmt::format("array '{}': bad name: {}", QuoteForMessage(a.name), why));
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
      // Version 3 keeps the chunk lists in the index: empty until read.
      const bool unread = m.format_version >= 3 && b.chunks.empty();
      if (chunked && (b.chunk_rows < 1 ||
                      (!unread && b.chunks.size() !=
                                      static_cast<uint64_t>(ChunkCount(b.box, b.chunk_rows))))) {
        return bad(
            fmt::format("array '{}' box {}: {} chunk checksums of {} rows each do not "
                        "cover it",
                        a.name, BoxToString(b.box), b.chunks.size(), b.chunk_rows));
      }
    }
    if (chunked && a.offset < -1) {
      return bad(fmt::format("array '{}': negative file offset {}", a.name, a.offset));
    }
  }
  return OkStatus();
}

}  // namespace

int64_t ChunkRows(const Box& box, DType dtype, uint64_t chunk_bytes) {
  if (box.count.empty() || box.count[0] <= 0) return 1;
  const uint64_t row_bytes =
      static_cast<uint64_t>(Volume(box.count).value_or(0) / box.count[0]) * DTypeSize(dtype);
  if (row_bytes == 0) return box.count[0];
  return std::max<int64_t>(1, static_cast<int64_t>(std::min<uint64_t>(
                                  chunk_bytes / row_bytes, static_cast<uint64_t>(box.count[0]))));
}

int64_t ChunkCount(const Box& box, int64_t chunk_rows) {
  if (box.count.empty()) return 1;
  if (chunk_rows < 1 || box.count[0] <= 0) return 0;
  return (box.count[0] - 1) / chunk_rows + 1;
}

void PlanChunks(Marker* marker, uint64_t chunk_bytes, int version) {
  marker->format_version = version;
  marker->chunk_bytes = chunk_bytes;
  for (MarkerArray& a : marker->arrays) {
    for (MarkerBox& b : a.boxes) {
      b.chunk_rows = ChunkRows(b.box, a.dtype, chunk_bytes);
      if (version >= 3) {
        b.chunks.clear();
      } else {
        b.chunks.assign(static_cast<size_t>(ChunkCount(b.box, b.chunk_rows)), 0);
      }
    }
  }
}

std::optional<std::vector<std::vector<int64_t>>> GridCuts(const MarkerArray& a) {
  if (a.boxes.empty()) return std::nullopt;
  const size_t dims = a.shape.size();
  std::vector<std::vector<int64_t>> cuts(dims);
  for (size_t d = 0; d < dims; ++d) {
    for (const MarkerBox& b : a.boxes) cuts[d].push_back(b.box.start[d]);
    cuts[d].push_back(a.shape[d]);
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    if (cuts[d].front() != 0) return std::nullopt;
  }
  // Cell k, in row-major order, must be box k.
  std::vector<size_t> cell(dims, 0);
  bool all_cells = false;  // the last cell was matched
  for (const MarkerBox& b : a.boxes) {
    if (all_cells) return std::nullopt;  // more boxes than cells
    for (size_t d = 0; d < dims; ++d) {
      if (cell[d] + 1 >= cuts[d].size() || b.box.start[d] != cuts[d][cell[d]] ||
          b.box.count[d] != cuts[d][cell[d] + 1] - cuts[d][cell[d]]) {
        return std::nullopt;
      }
    }
    size_t d = dims;
    while (d > 0 && ++cell[d - 1] + 1 >= cuts[d - 1].size()) cell[--d] = 0;
    all_cells = d == 0;
  }
  if (!all_cells) return std::nullopt;
  return cuts;
}

const MarkerArray* Marker::Find(const std::string& name) const {
  auto it = std::lower_bound(arrays.begin(), arrays.end(), name,
                             [](const MarkerArray& a, const std::string& n) { return a.name < n; });
  return it != arrays.end() && it->name == name ? &*it : nullptr;
}

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
                 "\"checksum\":\"{}\",\"file\":\"{}\"}},\"step\":{},\"total_bytes\":{},"
                 "\"user_metadata\":",
                 m.format_version, m.index.bytes, ChecksumToString(m.index.checksum),
                 kIndexFileName, m.step, m.total_bytes);
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
  fmt::format_to(std::back_inserter(out),
                 ",\"format\":\"mhckpt\",\"format_version\":{},\"step\":{},\"total_bytes\":{},"
                 "\"user_metadata\":",
                 m.format_version, m.step, m.total_bytes);
  out += json(m.user_metadata).dump();
  fmt::format_to(std::back_inserter(out), ",\"world_size\":{}}}\n", m.world_size);
  return out;  // one line: markers of 10k arrays stay small
}

namespace {

// The chunk fields of a version-2 box.
Status ParseChunks(BoxSlots& sb, const std::string& origin, const std::string& array,
                   MarkerBox* box) {
  box->chunk_rows = NeedInt<int64_t>(sb.chunk_rows, "chunk_rows");
  const std::vector<std::string>& sums = Need(sb.chunks, "chunks");
  box->chunks.reserve(sums.size());
  for (const std::string& sum : sums) {
    auto checksum = ChecksumFromString(sum);
    if (!checksum) {
      return DataLoss(fmt::format("commit marker '{}': array '{}': bad chunk checksum '{}'", origin,
                                  array, sum));
    }
    box->chunks.push_back(*checksum);
  }
  return OkStatus();
}

// Version 3: the boxes of an array, listed or as a grid of writers.
Status ParseBoxesV3(ArraySlots& sa, const std::string& origin, MarkerArray* a) {
  auto bad = [&](const std::string& why) {
    return DataLoss(fmt::format("commit marker '{}': array '{}': {}", origin, a->name, why));
  };
  if (!Volume(a->shape)) return bad(fmt::format("invalid shape {}", ShapeToString(a->shape)));
  if (sa.boxes.state != SlotState::kMissing) {
    a->boxes.reserve(Need(sa.boxes, "boxes").size());
    for (BoxSlots& sb : sa.boxes.value) {
      Need(sb.start, "start");
      Need(sb.count, "count");
      a->boxes.push_back(MarkerBox{Box{std::move(sb.start.value), std::move(sb.count.value)},
                                   NeedInt<int>(sb.writer, "writer"),
                                   0,
                                   0,
                                   {}});
    }
    return OkStatus();
  }
  const std::vector<Slot<std::vector<int64_t>>>& grid = Need(sa.grid, "grid");
  const std::vector<int64_t>& writers = Need(sa.writers, "writers");
  if (grid.size() != a->shape.size()) {
    return bad(
        fmt::format("a grid of {} dimensions for a shape of {}", grid.size(), a->shape.size()));
  }
  // Every dimension's cuts go from 0 to its extent, strictly rising; the
  // cells, counted without overflow, are exactly the writers.
  uint64_t cells = 1;
  for (size_t d = 0; d < grid.size(); ++d) {
    const std::vector<int64_t>& cuts = Need(grid[d], "grid");
    bool rising = cuts.size() >= 2 && cuts.front() == 0 && cuts.back() == a->shape[d];
    for (size_t i = 1; rising && i < cuts.size(); ++i) rising = cuts[i - 1] < cuts[i];
    if (!rising) {
      return bad(
          fmt::format("the grid's cuts of dimension {} do not rise from 0 to {}", d, a->shape[d]));
    }
    if (__builtin_mul_overflow(cells, cuts.size() - 1, &cells) || cells > writers.size()) {
      return bad(fmt::format("a grid of more cells than its {} writers", writers.size()));
    }
  }
  if (cells != writers.size()) {
    return bad(fmt::format("a grid of {} cells with {} writers", cells, writers.size()));
  }
  a->boxes.resize(writers.size());
  std::vector<size_t> cell(grid.size(), 0);
  for (size_t k = 0; k < writers.size(); ++k) {
    MarkerBox& b = a->boxes[k];
    if (writers[k] < 0 || writers[k] > std::numeric_limits<int>::max()) {
      return bad(fmt::format("writer {} out of range", writers[k]));
    }
    b.writer = static_cast<int>(writers[k]);
    b.box.start.resize(grid.size());
    b.box.count.resize(grid.size());
    for (size_t d = 0; d < grid.size(); ++d) {
      b.box.start[d] = grid[d].value[cell[d]];
      b.box.count[d] = grid[d].value[cell[d] + 1] - b.box.start[d];
    }
    for (size_t d = grid.size(); d > 0 && ++cell[d - 1] + 1 >= grid[d - 1].value.size(); --d) {
      cell[d - 1] = 0;
    }
  }
  return OkStatus();
}

}  // namespace

Result<Marker> ParseMarker(const std::string& text, const std::string& origin, MarkerText what) {
  auto malformed = [&](const std::string& why) {
    return DataLoss(fmt::format("commit marker '{}' is malformed: {}", origin, why));
  };
  MarkerSlots s;
  MarkerSax sax(&s);
  if (!json::sax_parse(text, &sax)) return malformed(sax.error());
  Marker m;
  try {
    if (!s.is_object) throw Malformed{"not a JSON object"};
    if (Need(s.format, "format") != "mhckpt") {
      return DataLoss(fmt::format("commit marker '{}': not an mhckpt marker", origin));
    }
    m.format_version = NeedInt<int>(s.format_version, "format_version");
    if (m.format_version < kOldestFormatVersion || m.format_version > kFormatVersion) {
      return Validate(m, origin);
    }
    const bool chunked = m.format_version >= 2;
    if (chunked) m.chunk_bytes = NeedInt<uint64_t>(s.chunk_bytes, "chunk_bytes");
    m.step = NeedInt<int64_t>(s.step, "step");
    m.world_size = NeedInt<int>(s.world_size, "world_size");
    m.created_unix_ms = NeedInt<int64_t>(s.created_unix_ms, "created_unix_ms");
    m.data_file = Need(s.data_file, "data_file");
    m.total_bytes = NeedInt<uint64_t>(s.total_bytes, "total_bytes");
    m.user_metadata = std::move(s.user_metadata.value);
    Need(s.user_metadata, "user_metadata");
    const bool indexed = m.format_version >= 3;
    if (indexed && s.files.state != SlotState::kMissing) m.files = NeedInt<int>(s.files, "files");
    if (indexed && what == MarkerText::kCommit) {
      Need(s.index, "index");
      if (Need(s.index_file, "index.file") != kIndexFileName) {
        return DataLoss(fmt::format("commit marker '{}': unexpected index file '{}'", origin,
                                    s.index_file.value));
      }
      m.index.bytes = NeedInt<uint64_t>(s.index_bytes, "index.bytes");
      const std::string& sum = Need(s.index_checksum, "index.checksum");
      auto checksum = ChecksumFromString(sum);
      if (!checksum) {
        return DataLoss(fmt::format("commit marker '{}': bad index checksum '{}'", origin, sum));
      }
      m.index.checksum = *checksum;
    }
    m.arrays.reserve(Need(s.arrays, "arrays").size());
    for (ArraySlots& sa : s.arrays.value) {
      MarkerArray a;
      a.name = Need(sa.name, "name");
      const std::string& dtype_name = Need(sa.dtype, "dtype");
      auto dtype = DTypeFromName(dtype_name);
      if (!dtype) {
        return DataLoss(fmt::format("commit marker '{}': array '{}': unknown dtype '{}'", origin,
                                    a.name, dtype_name));
      }
      a.dtype = *dtype;
      a.shape = std::move(sa.shape.value);
      Need(sa.shape, "shape");
      a.replicated = Need(sa.replicated, "replicated");
      if (chunked) a.offset = NeedInt<int64_t>(sa.offset, "offset");
      if (indexed) {
        MHCKPT_RETURN_IF_ERROR(ParseBoxesV3(sa, origin, &a));
        m.arrays.push_back(std::move(a));
        continue;
      }
      a.boxes.reserve(Need(sa.boxes, "boxes").size());
      for (BoxSlots& sb : sa.boxes.value) {
        const std::string& sum = Need(sb.checksum, "checksum");
        auto checksum = ChecksumFromString(sum);
        if (!checksum) {
          return DataLoss(fmt::format("commit marker '{}': array '{}': bad checksum '{}'", origin,
                                      a.name, sum));
        }
        Need(sb.start, "start");
        Need(sb.count, "count");
        a.boxes.push_back(MarkerBox{Box{std::move(sb.start.value), std::move(sb.count.value)},
                                    NeedInt<int>(sb.writer, "writer"),
                                    *checksum,
                                    0,
                                    {}});
        if (chunked && what == MarkerText::kCommit) {
          MHCKPT_RETURN_IF_ERROR(ParseChunks(sb, origin, a.name, &a.boxes.back()));
        }
      }
      m.arrays.push_back(std::move(a));
    }
  } catch (const Malformed& e) {
    return malformed(e.why);
  }
  // A plan's chunks are sized here, as rank 0 sized them (Validate refuses
  // a chunk size of 0).
  // Version 3 sizes every box's chunks here (the chunk lists are in the
  // index).
  if ((what == MarkerText::kPlan || m.format_version >= 3) && m.format_version >= 2 &&
      m.chunk_bytes > 0) {
    PlanChunks(&m, m.chunk_bytes, m.format_version);
  }
  MHCKPT_RETURN_IF_ERROR(CheckMarker(m, origin));
  if (m.format_version >= 3 && what == MarkerText::kCommit) {
    MHCKPT_ASSIGN_OR_RETURN(IndexLayout layout, IndexLayout::Of(m, origin));
    if (layout.total() != m.index.bytes) {
      return DataLoss(
          fmt::format("commit marker '{}': the index is {} bytes, but its boxes' records take {}",
                      origin, m.index.bytes, layout.total()));
    }
  }
  return m;
}

Status CheckMarker(const Marker& m, const std::string& origin) {
  if (m.data_file != kDataFileName) {
    return DataLoss(
        fmt::format("commit marker '{}': unexpected data file '{}'", origin, m.data_file));
  }
  return Validate(m, origin);
}

Result<Marker> ReadMarker(const std::string& path) {
  MHCKPT_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxMarkerBytes));
  return ParseMarker(text, path);
}

}  // namespace mhckpt::io
