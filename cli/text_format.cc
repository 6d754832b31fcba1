#include "cli/text_format.h"

#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>

namespace mhckpt::cli {

std::string HumanBytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 - 0.05 && u < 4) {  // never "1024.0 KiB"
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : 1, units[u]);
}

std::string LocalTime(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  return fmt::format("{:%Y-%m-%d %H:%M:%S}", fmt::localtime(t));
}

}  // namespace mhckpt::cli
