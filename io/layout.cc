#include "io/layout.h"

#include <charconv>

#include <fmt/format.h>

namespace mhckpt::io {

std::string StepDirName(int64_t step) { return fmt::format("step_{:010d}", step); }

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  std::string_view digits = name.substr(kPrefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  if (StepDirName(step) != name) return std::nullopt;  // one spelling per step
  return step;
}

std::string StepDir(const std::string& root, int64_t step) {
  return fmt::format("{}/{}", root, StepDirName(step));
}
std::string DataPath(const std::string& root, int64_t step) {
  return fmt::format("{}/{}", StepDir(root, step), kDataFileName);
}
std::string MarkerPath(const std::string& root, int64_t step) {
  return fmt::format("{}/{}", StepDir(root, step), kMarkerFileName);
}

std::string IndexPath(const std::string& root, int64_t step) {
  return fmt::format("{}/{}", StepDir(root, step), kIndexFileName);
}

std::string SubfileName(int64_t file) { return fmt::format("data-{:05d}.h5", file); }
std::string SubfilePath(const std::string& root, int64_t step, int64_t file) {
  return fmt::format("{}/{}", StepDir(root, step), SubfileName(file));
}

}  // namespace mhckpt::io
