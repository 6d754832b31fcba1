// Exceptions stop at every thread and callback boundary of mhckpt.
//
// mhckpt reports errors as Status values; an exception that escapes a thread
// ends the process (std::terminate), and one that escapes a rank-local part
// of a collective protocol leaves the other ranks waiting. So every place
// where foreign or throwing code runs — the I/O thread's jobs, the copy
// threads, user callbacks, rank 0's sections of a protocol (nlohmann::json,
// std::bad_alloc) — calls it through Guarded, which turns an exception into
// an Internal status naming where it happened (and the rank, in `where`).
#pragma once

#include <string_view>
#include <type_traits>
#include <utility>

#include "base/status.h"

namespace mhckpt {

/// Inside a catch block: Internal("<where>: unexpected exception: <what>").
Status CurrentExceptionStatus(std::string_view where);

/// Runs `f` (returning Status or void) and returns its Status; an exception
/// becomes CurrentExceptionStatus(where).
template <typename F>
Status Guarded(std::string_view where, F&& f) noexcept {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      std::forward<F>(f)();
      return OkStatus();
    } else {
      return std::forward<F>(f)();
    }
  } catch (...) {
    return CurrentExceptionStatus(where);
  }
}

}  // namespace mhckpt
