// A one-line progress indicator on stderr, shown only when stderr is a
// terminal (never in logs or pipes), redrawn at most ten times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mhckpt::cli {

class Progress {
 public:
  /// Shows progress only if `enabled` and stderr is a terminal.
  explicit Progress(bool enabled);
  ~Progress();  ///< clears the line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Starts a new task of `total` units (bytes) called `label`.
  void Start(std::string label, uint64_t total);
  /// Records `units` more done.
  void Advance(uint64_t units);
  /// Clears the line (before printing anything else).
  void Clear();

 private:
  void Draw();

  bool shown_;
  bool dirty_ = false;
  std::string label_;
  uint64_t total_ = 0, done_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace mhckpt::cli
