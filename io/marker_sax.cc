#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/marker_slots.h"

namespace mhckpt::io::marker_internal {
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
          // A repeated "index" replaces the earlier one whole.
          out_->index_file = {};
          out_->index_bytes = {};
          out_->index_checksum = {};
          out_->index.Set(true);
          Push(Kind::kIndex);
          return true;
        }
        if (key_ == "preemption") {
          // A repeated "preemption" replaces the earlier one whole.
          out_->preemption_notice_unix_ms = {};
          out_->preemption_grace_ms = {};
          out_->preemption_saved_after_ms = {};
          out_->preemption.Set(true);
          Push(Kind::kPreemption);
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
    kPreemption,
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
        if (key_ == "preemption") out_->preemption.Bad();
        break;
      case Kind::kPreemption:
        if (key_ == "notice_unix_ms") out_->preemption_notice_unix_ms.Bad();
        if (key_ == "grace_ms") out_->preemption_grace_ms.Bad();
        if (key_ == "saved_after_ms") out_->preemption_saved_after_ms.Bad();
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
      case Kind::kPreemption:
        if (v == Value::kNumber) {
          if (key_ == "notice_unix_ms") return out_->preemption_notice_unix_ms.Set(num_), true;
          if (key_ == "grace_ms") return out_->preemption_grace_ms.Set(num_), true;
          if (key_ == "saved_after_ms") return out_->preemption_saved_after_ms.Set(num_), true;
        }
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

}  // namespace

bool ReadMarkerSlots(const std::string& text, MarkerSlots* out, std::string* error) {
  MarkerSax sax(out);
  if (json::sax_parse(text, &sax)) return true;
  *error = sax.error();
  return false;
}

}  // namespace mhckpt::io::marker_internal
