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

  /// `label`: `done` of `total` bytes. Drawn at once when a task starts
  /// (`done` == 0), then at most ten times a second.
  void Update(const std::string& label, uint64_t done, uint64_t total);
  /// Clears the line (before printing anything else).
  void Clear();

 private:
  bool shown_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace mhckpt::cli
