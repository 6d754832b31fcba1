// The fields of a commit marker as its JSON reader fills them (io/marker.h,
// ParseMarker): each field missing, of its type, or of another. Internal to
// io/marker*.cc.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace mhckpt::io::marker_internal {

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
  // The optional "preemption" object: whether it was there, and its fields.
  Slot<bool> preemption;
  Slot<Num> preemption_notice_unix_ms, preemption_grace_ms, preemption_saved_after_ms;
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

/// Reads the JSON `text` into `out` (SAX events, no DOM). False on a JSON
/// syntax error, described in `error`; fields of a wrong type are marked in
/// `out`, not reported here.
bool ReadMarkerSlots(const std::string& text, MarkerSlots* out, std::string* error);

}  // namespace mhckpt::io::marker_internal
