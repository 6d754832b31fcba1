#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/text_format.h"

namespace mhckpt::cli {

Progress::Progress(bool enabled) : shown_(enabled && ::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { Clear(); }

void Progress::Update(const std::string& label, uint64_t done, uint64_t total) {
  if (!shown_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done != 0 && now - last_draw_ <= std::chrono::milliseconds(100)) return;
  const double pct =
      total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  fmt::print(stderr, "\r\033[K{}: {} of {} ({:.0f}%)", label, HumanBytes(done), HumanBytes(total),
             pct);
  std::fflush(stderr);
  dirty_ = true;
  last_draw_ = now;
}

void Progress::Clear() {
  if (!shown_ || !dirty_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  dirty_ = false;
}

}  // namespace mhckpt::cli
