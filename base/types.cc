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
  if (name.size() > 1024) return "the name is longer than 1024 characters";
  if (name.front() == '/') return "the name is absolute (starts with '/')";
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) return "the name has a character outside printable ASCII";
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

}  // namespace mhckpt
