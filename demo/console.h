// Output of the demo: rank 0 prints, one flushed line at a time, so that
// lines arrive in order through mpirun's pipes.
#pragma once

#include <cstdio>

#include <fmt/format.h>

namespace mhckpt::demo {

class Console {
 public:
  explicit Console(int rank) : rank_(rank) {}

  /// Prints one line on rank 0; nothing elsewhere.
  template <typename... Args>
  void Line(fmt::format_string<Args...> format, Args&&... args) const {
    if (rank_ != 0) return;
    fmt::print(stdout, format, std::forward<Args>(args)...);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace mhckpt::demo
