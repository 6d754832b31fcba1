// Lazy saves read caller memory after Save has returned (SaveOptions::copy),
// so two things can go wrong that a blocking save never meets: the caller
// frees a buffer while it is being copied, or writes to it before the copy.
// GuardedCopy turns the first into an error instead of a crash; WriteWatch
// (SaveOptions::protect_host) turns the second into an immediate, named
// failure instead of silently torn bytes.
//
// Both rest on one SIGSEGV/SIGBUS handler, installed the first time either
// is used. A fault it does not own (not inside a guarded copy, not on a
// watched page) goes to the handler that was there before, or ends the
// process as it would have without mhckpt.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::internal {

/// memcpy, except that a fault reading `src` (memory unmapped or made
/// unreadable during the copy) stops it and returns false instead of
/// killing the process. The bytes copied so far are then unspecified.
bool GuardedCopy(void* dst, const void* src, size_t bytes);

/// Write-protects caller memory until Release: the whole pages inside each
/// range (a page the range shares with other memory is left writable, so no
/// write elsewhere is caught by mistake). A write to a watched page prints
/// the range's message to stderr and aborts the process.
class WriteWatch {
 public:
  struct Range {
    const void* data = nullptr;
    size_t bytes = 0;
    std::string message;  ///< printed when a write hits the range
  };
  WriteWatch() = default;
  ~WriteWatch();  ///< releases
  WriteWatch(const WriteWatch&) = delete;
  WriteWatch& operator=(const WriteWatch&) = delete;

  /// Protects `ranges` (PROT_READ). IoError naming the range if mprotect
  /// refuses (memory that is not a private or shared mapping the process may
  /// change, e.g. read-only already); what was protected is then released.
  Status Protect(const std::vector<Range>& ranges);
  /// Makes the watched pages readable and writable again (the state mhckpt
  /// expects caller memory to be in: a buffer being saved was written by the
  /// caller). Idempotent.
  void Release();
  /// Bytes of whole pages watched now.
  [[nodiscard]] size_t watched_bytes() const;

 private:
  struct Span {
    void* begin;
    size_t bytes;
  };
  std::vector<Span> spans_;
  std::vector<int> ids_;  // entries in the handler's table
};

}  // namespace mhckpt::internal
