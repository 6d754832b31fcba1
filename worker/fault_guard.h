// Lazy saves read caller memory after Save has returned (SaveOptions::copy),
// so two things can go wrong that a blocking save never meets: the caller
// frees a buffer while it is being copied, or writes to it before the copy.
// GuardedCopy turns the first into an error instead of a crash; WriteWatch
// (SaveOptions::protect_host) turns the second into an immediate, named
// failure instead of silently torn bytes.
//
// Both rest on one SIGSEGV/SIGBUS handler, installed the first time either
// is used and never changed after. A fault it does not own (not inside a
// guarded copy, not on a watched page) is first sent back to run again: it
// may be a write that faulted on a watched page while another thread's
// Release was making it writable, and whose entry was gone by the time the
// handler ran — the copy has ended, so the write is allowed, and it succeeds
// on the retry. A fault that repeats at the same address with no Release in
// between (and any SIGSEGV/SIGBUS sent by a process) goes to the handler
// that was there before mhckpt, or ends the process as it would have without
// mhckpt: only then, on its way to the default action, does the handler put
// back the disposition that was there before it. So a late fault never
// uninstalls the handler that other guards and copies rely on.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace mhckpt::internal {

/// memcpy, except that a fault reading `src` (memory unmapped or made
/// unreadable during the copy) stops it and returns false instead of
/// killing the process. The bytes copied so far are then unspecified.
bool GuardedCopy(void* dst, const void* src, size_t bytes);

/// GuardedCopy with streaming stores (worker/copy.h CopyUncached), then
/// `read(src, bytes)` under the same guard, while the source is still in
/// cache (a checksum of the bytes just copied, without reading the
/// destination back from memory). False if either faulted reading `src`;
/// `read` must then hold no lock and own nothing that needs freeing, since
/// it is left by a jump.
bool GuardedCopyUncached(void* dst, const void* src, size_t bytes,
                         const std::function<void(const void*, size_t)>& read);

/// Write-protects caller memory until Release: the whole pages inside each
/// range (a page the range shares with other memory is left writable, so no
/// write elsewhere is caught by mistake). A write to a watched page prints
/// the range's message to stderr and aborts the process. Only pages that
/// were writable are watched: Protect takes away PROT_WRITE alone, and
/// Release gives each page back the protection it had before Protect (read
/// from /proc/self/maps; where that cannot be read, every page is taken as
/// readable and writable). A page that was read-only before stays read-only.
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

  /// Protects the writable pages of `ranges` (their protection without
  /// PROT_WRITE). IoError naming the range if part of it is not mapped or
  /// mprotect refuses; what was protected is then released.
  Status Protect(const std::vector<Range>& ranges);
  /// Gives every watched page back the protection it had before Protect,
  /// then stops watching it (a write that faulted on it while it was
  /// watched, and is handled before that, still aborts). Idempotent.
  void Release();
  /// Bytes of whole pages watched now.
  [[nodiscard]] size_t watched_bytes() const;

 private:
  struct Span {
    void* begin;
    size_t bytes;
    int prot;  ///< before Protect
  };
  std::vector<Span> spans_;
  std::vector<int> ids_;  // entries in the handler's table
};

}  // namespace mhckpt::internal
