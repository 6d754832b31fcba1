#include "worker/fault_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace mhckpt::internal {
namespace {

// One watched run of pages. `hi` is stored last (release) and cleared first,
// so the handler never matches a half-written entry.
struct Entry {
  std::atomic<uintptr_t> lo{0};
  std::atomic<uintptr_t> hi{0};
  const char* message = nullptr;
  size_t length = 0;
};

constexpr int kMaxEntries = 16384;
Entry g_entries[kMaxEntries];  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
std::mutex g_entries_mu;       // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
// Free entries, under g_entries_mu; filled on first use.
std::vector<int>& FreeEntries() {
  static std::vector<int> free = [] {
    std::vector<int> ids(kMaxEntries);
    for (int i = 0; i < kMaxEntries; ++i) ids[i] = kMaxEntries - 1 - i;
    return ids;
  }();
  return free;
}

struct sigaction g_old_segv {};  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
struct sigaction g_old_bus {};   // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

// The guarded copy running on this thread, if any. volatile: the compiler
// must store it before the copy, which it knows does not read it.
thread_local sigjmp_buf* volatile t_guard = nullptr;

void Chain(int sig, siginfo_t* info, void* context) {
  const struct sigaction& old = sig == SIGSEGV ? g_old_segv : g_old_bus;
  if ((old.sa_flags & SA_SIGINFO) != 0 && old.sa_sigaction != nullptr) {
    old.sa_sigaction(sig, info, context);
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  } else {
    // As without mhckpt: the faulting instruction runs again and the
    // default action ends the process.
    sigaction(sig, &old, nullptr);
  }
}

void OnFault(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const Entry& e : g_entries) {
    const uintptr_t hi = e.hi.load(std::memory_order_acquire);
    if (hi != 0 && addr >= e.lo.load(std::memory_order_relaxed) && addr < hi) {
      (void)!write(STDERR_FILENO, e.message, e.length);
      signal(SIGABRT, SIG_DFL);
      abort();
    }
  }
  Chain(sig, info, context);
}

void InstallHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnFault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
  });
}

size_t PageSize() {
  static const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

bool GuardedCopy(void* dst, const void* src, size_t bytes) {
  InstallHandler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &jump;
  std::memcpy(dst, src, bytes);
  t_guard = nullptr;
  return true;
}

WriteWatch::~WriteWatch() { Release(); }

Status WriteWatch::Protect(const std::vector<Range>& ranges) {
  InstallHandler();
  const size_t page = PageSize();
  for (const Range& r : ranges) {
    const auto lo = reinterpret_cast<uintptr_t>(r.data);
    const uintptr_t begin = (lo + page - 1) / page * page;
    const uintptr_t end = (lo + r.bytes) / page * page;
    if (r.data == nullptr || end <= begin) continue;  // no whole page inside
    int id = -1;
    {
      std::lock_guard<std::mutex> lock(g_entries_mu);
      if (!FreeEntries().empty()) {
        id = FreeEntries().back();
        FreeEntries().pop_back();
        Entry& e = g_entries[id];
        char* text = new char[r.message.size() + 1];
        std::memcpy(text, r.message.c_str(), r.message.size() + 1);
        e.message = text;
        e.length = r.message.size();
        e.lo.store(begin, std::memory_order_relaxed);
        e.hi.store(end, std::memory_order_release);
      }
    }
    if (id < 0) {
      Release();
      return InvalidArgument(fmt::format(
          "more than {} buffers write-protected at once (SaveOptions::protect_host)", kMaxEntries));
    }
    ids_.push_back(id);
    // NOLINTNEXTLINE(performance-no-int-to-ptr)
    void* p = reinterpret_cast<void*>(begin);
    if (mprotect(p, end - begin, PROT_READ) != 0) {
      const int err = errno;
      Release();
      return IoError(fmt::format("cannot write-protect {} bytes at {} ({}): {}", end - begin, p,
                                 r.message, std::strerror(err)));
    }
    spans_.push_back({p, end - begin});
  }
  return OkStatus();
}

void WriteWatch::Release() {
  for (const Span& s : spans_) mprotect(s.begin, s.bytes, PROT_READ | PROT_WRITE);
  spans_.clear();
  std::lock_guard<std::mutex> lock(g_entries_mu);
  for (int id : ids_) {
    Entry& e = g_entries[id];
    e.hi.store(0, std::memory_order_release);
    e.lo.store(0, std::memory_order_relaxed);
    delete[] e.message;
    e.message = nullptr;
    e.length = 0;
    FreeEntries().push_back(id);
  }
  ids_.clear();
}

size_t WriteWatch::watched_bytes() const {
  size_t n = 0;
  for (const Span& s : spans_) n += s.bytes;
  return n;
}

}  // namespace mhckpt::internal
