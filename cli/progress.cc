#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "cli/text_format.h"

namespace mhckpt::cli {

Progress::Progress(bool enabled) : shown_(enabled && ::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { Clear(); }

void Progress::Start(std::string label, uint64_t total) {
  label_ = std::move(label);
  total_ = total;
  done_ = 0;
  last_draw_ = {};
  Draw();
}

void Progress::Advance(uint64_t units) {
  done_ += units;
  if (std::chrono::steady_clock::now() - last_draw_ > std::chrono::milliseconds(100)) Draw();
}

void Progress::Clear() {
  if (!shown_ || !dirty_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  dirty_ = false;
}

void Progress::Draw() {
  if (!shown_) return;
  const double pct =
      total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  fmt::print(stderr, "\r\033[K{}: {} of {} ({:.0f}%)", label_, HumanBytes(done_),
             HumanBytes(total_), pct);
  std::fflush(stderr);
  dirty_ = true;
  last_draw_ = std::chrono::steady_clock::now();
}

}  // namespace mhckpt::cli
