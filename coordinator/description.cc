// A rank's description of what it holds, as it travels in the plan round of a
// save (coordinator/plan.h): Describe builds it from the rank's snapshot,
// EncodeDescription / DecodeDescription carry it to rank 0 (which decodes one
// per distinct layout, coordinator/layouts.h), and DescriptionHash lets a
// rank see, without encoding, that it holds what it held at the last save.
#include "coordinator/plan.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace mhckpt::internal {

RankDescription Describe(int64_t step, const Status& local, const Snapshot& snapshot) {
  RankDescription d{step, local, {}};
  if (!local.ok()) return d;  // the plan fails with the error; the arrays do not matter
  for (const StagedArray& a : snapshot.arrays) {
    ArrayDescription ad{a.name, a.dtype, a.shape, {}};
    for (const StagedBox& b : a.boxes) ad.boxes.push_back(b.box);
    d.arrays.push_back(std::move(ad));
  }
  return d;
}

// A description travels as variable-length integers (LEB128; signed ones
// zigzag-coded) — a length before every string and list — rather than CBOR:
// as compact, and rank 0 decodes one per distinct layout, where at 10,000
// arrays a CBOR document took ~25 ms and this takes ~3 ms (docs/SCALE.md).
namespace {

class Writer {
 public:
  void U64(uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    out_.push_back(static_cast<char>(v));
  }
  void I64s(const std::vector<int64_t>& v) {
    U64(v.size());
    for (int64_t x : v) U64((static_cast<uint64_t>(x) << 1) ^ static_cast<uint64_t>(x >> 63));
  }
  void Str(const std::string& v) {
    U64(v.size());
    out_.append(v);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  bool U64(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && at_ < in_.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(in_[at_++]);
      *v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  bool I64s(std::vector<int64_t>* v) {
    uint64_t n = 0;
    if (!U64(&n) || n > Left()) return false;  // every value takes at least a byte
    v->resize(n);
    for (int64_t& x : *v) {
      uint64_t z = 0;
      if (!U64(&z)) return false;
      x = static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
    }
    return true;
  }
  bool Str(std::string* v) {
    uint64_t n = 0;
    if (!U64(&n) || n > Left()) return false;
    v->assign(in_.data() + at_, n);
    at_ += n;
    return true;
  }
  [[nodiscard]] size_t Left() const { return in_.size() - at_; }

 private:
  const std::string& in_;
  size_t at_ = 0;
};

// One array of a description; false if the bytes end early.
bool ReadArray(Reader& r, ArrayDescription* a) {
  uint64_t dtype = 0, boxes = 0;
  if (!r.Str(&a->name) || !r.U64(&dtype) || !r.I64s(&a->shape) || !r.U64(&boxes)) return false;
  // An out-of-range value stays out of range (CheckDecoded refuses it).
  a->dtype = static_cast<DType>(std::min<uint64_t>(dtype, kNumDTypes));
  if (boxes > r.Left()) return false;
  a->boxes.resize(boxes);
  for (Box& b : a->boxes) {
    if (!r.I64s(&b.start) || !r.I64s(&b.count)) return false;
  }
  return true;
}

}  // namespace

std::string EncodeDescription(const RankDescription& d) {
  Writer w;
  w.U64(static_cast<uint64_t>(d.step));
  w.U64(static_cast<uint64_t>(d.status.code()));
  w.Str(d.status.message());
  w.U64(d.arrays.size());
  for (const ArrayDescription& a : d.arrays) {
    w.Str(a.name);
    w.U64(static_cast<uint64_t>(a.dtype));
    w.I64s(a.shape);
    w.U64(a.boxes.size());
    for (const Box& b : a.boxes) {
      w.I64s(b.start);
      w.I64s(b.count);
    }
  }
  return w.Take();
}

namespace {

// What a description must hold for BuildPlan to read it safely: codes and
// dtypes inside their enums, shapes with a volume, boxes inside them. A
// rank's own snapshot guarantees all of it; this checks what arrived.
std::string CheckDecoded(const ArrayDescription& a) {
  if (!IsValidDType(a.dtype)) return fmt::format("dtype {}", static_cast<int>(a.dtype));
  if (a.shape.size() > kMaxDims || !Volume(a.shape)) return "shape " + ShapeToString(a.shape);
  for (const Box& b : a.boxes) {
    if (std::string why = CheckBoxInShape(b, a.shape); !why.empty()) {
      return fmt::format("box {}: {}", BoxToString(b), why);
    }
  }
  return {};
}

}  // namespace

Result<RankDescription> DecodeDescription(const std::string& bytes) {
  Reader r(bytes);
  RankDescription d;
  uint64_t step = 0, code = 0, arrays = 0;
  std::string message;
  bool ok = r.U64(&step) && r.U64(&code) && r.Str(&message) && r.U64(&arrays) && arrays <= r.Left();
  if (ok) {
    std::optional<StatusCode> known = StatusCodeFromInt(
        code > static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(code));
    if (!known) {
      return Internal(fmt::format("a rank's description has the unknown status code {}", code));
    }
    d.step = static_cast<int64_t>(step);
    d.status = Status(*known, std::move(message));
    d.arrays.resize(arrays);
    for (ArrayDescription& a : d.arrays) ok = ok && ReadArray(r, &a);
  }
  if (!ok || r.Left() != 0) {
    return Internal(fmt::format("cannot decode a rank's description ({} bytes)", bytes.size()));
  }
  for (const ArrayDescription& a : d.arrays) {
    if (std::string why = CheckDecoded(a); !why.empty()) {
      return Internal(fmt::format("a rank's description of array '{}' is damaged: {}",
                                  QuoteForMessage(a.name), why));
    }
  }
  return d;
}

uint64_t DescriptionHash(const Snapshot& snapshot) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) {  // no memory for the streaming state: hash the encoded form
    std::string bytes = EncodeDescription(Describe(0, OkStatus(), snapshot));
    return XXH3_64bits(bytes.data(), bytes.size());
  }
  XXH3_64bits_reset(state);
  // Every field is preceded by its length, so different holdings give
  // different byte streams.
  auto add = [&](const void* p, size_t n) { XXH3_64bits_update(state, p, n); };
  auto add_size = [&](uint64_t n) { add(&n, sizeof n); };
  auto add_ints = [&](const std::vector<int64_t>& v) {
    add_size(v.size());
    add(v.data(), v.size() * sizeof(int64_t));
  };
  add_size(snapshot.arrays.size());
  for (const StagedArray& a : snapshot.arrays) {
    add_size(a.name.size());
    add(a.name.data(), a.name.size());
    add_size(static_cast<uint64_t>(a.dtype));
    add_ints(a.shape);
    add_size(a.boxes.size());
    for (const StagedBox& b : a.boxes) {
      add_ints(b.box.start);
      add_ints(b.box.count);
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

}  // namespace mhckpt::internal
