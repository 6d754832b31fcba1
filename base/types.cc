#include "base/types.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace mhckpt {
namespace {

constexpr int64_t kMaxVolume = int64_t{1} << 62;

}  // namespace

std::string BoxToString(const Box& box) {
  std::string out = "[";
  size_t n = std::max(box.start.size(), box.count.size());
  for (size_t d = 0; d < n; ++d) {
    int64_t s = d < box.start.size() ? box.start[d] : 0;
    int64_t c = d < box.count.size() ? box.count[d] : 0;
    if (d) out += ", ";
    int64_t end = 0;
    if (__builtin_add_overflow(s, c, &end)) {
      out += fmt::format("{}:{}+{}", s, s, c);  // a forged box: say it, do not overflow
    } else {
      out += fmt::format("{}:{}", s, end);
    }
  }
  return out + "]";
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::optional<int64_t> Volume(const std::vector<int64_t>& shape) {
  int64_t v = 1;
  bool zero = false;
  for (int64_t e : shape) {
    if (e < 0 || e > kMaxVolume) return std::nullopt;
    if (e == 0)
      zero = true;
    else if (v > kMaxVolume / e)
      return std::nullopt;
    else
      v *= e;
  }
  return zero ? 0 : v;
}

size_t BoxBytes(const Box& box, DType dtype) {
  return static_cast<size_t>(Volume(box.count).value_or(0)) * DTypeSize(dtype);
}

std::pair<int64_t, int64_t> SplitRange(int64_t n, int parts, int part) {
  const int64_t base = n / parts, longer = n % parts;
  const int64_t begin = part * base + std::min<int64_t>(part, longer);
  return {begin, begin + base + (part < longer ? 1 : 0)};
}

Box FullBox(const std::vector<int64_t>& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

std::string CheckBoxInShape(const Box& box, const std::vector<int64_t>& shape) {
  if (box.start.size() != shape.size() || box.count.size() != shape.size()) {
    return fmt::format("box has {} start and {} count values for a {}-d array", box.start.size(),
                       box.count.size(), shape.size());
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.start[d] < 0 || box.count[d] < 0)
      return fmt::format("negative value in dimension {}", d);
    if (box.start[d] > shape[d] || box.count[d] > shape[d] - box.start[d]) {
      int64_t end = 0;
      if (__builtin_add_overflow(box.start[d], box.count[d], &end)) {
        return fmt::format("dimension {} ends past 2^63, past the extent {}", d, shape[d]);
      }
      return fmt::format("dimension {} ends at {}, past the extent {}", d, end, shape[d]);
    }
  }
  return {};
}

bool BoxesIntersect(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.start.size(); ++d) {
    int64_t lo = std::max(a.start[d], b.start[d]);
    int64_t hi = std::min(a.start[d] + a.count[d], b.start[d] + b.count[d]);
    if (lo >= hi) return false;
  }
  return true;
}

std::string CheckArrayName(std::string_view name) {
  if (name.empty()) return "the name is empty";
  if (name.size() > kMaxNameBytes) {
    return fmt::format("the name is {} bytes long, more than {}", name.size(), kMaxNameBytes);
  }
  if (name.front() == '/') return "the name is absolute (starts with '/')";
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return "the name has a character outside printable ASCII";
  }
  if (size_t depth = 1 + static_cast<size_t>(std::count(name.begin(), name.end(), '/'));
      depth > kMaxNameDepth) {
    return fmt::format("the name has {} path components, more than {}", depth, kMaxNameDepth);
  }
  size_t pos = 0;
  while (pos <= name.size()) {
    size_t end = name.find('/', pos);
    if (end == std::string_view::npos) end = name.size();
    std::string_view comp = name.substr(pos, end - pos);
    if (comp.empty()) return "the name has an empty path component";
    if (comp == "." || comp == "..") return "the name has a '.' or '..' path component";
    pos = end + 1;
  }
  return {};
}

std::string CheckUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  auto bad = [&](size_t at) {
    return fmt::format("not valid UTF-8 (byte 0x{:02x} at offset {})", p[at], at);
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The length of the sequence and the range of its second byte
    // (RFC 3629, section 4): this excludes overlong forms, surrogates
    // (U+D800..U+DFFF) and code points past U+10FFFF.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return bad(i);
    }
    if (i + len > n) return fmt::format("not valid UTF-8 (a sequence cut short at offset {})", i);
    if (p[i + 1] < lo || p[i + 1] > hi) return bad(i + 1);
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return bad(i + k);
    }
    i += len;
  }
  return {};
}

std::string QuoteForMessage(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t shown = std::min(text.size(), max_bytes);
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c <= 0x7e && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (shown < text.size()) out += fmt::format("...({} bytes)", text.size());
  return out;
}

}  // namespace mhckpt
