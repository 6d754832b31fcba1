#include "worker/fault_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "worker/copy.h"

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

// Releases so far: WriteWatch::Release adds one after it has made its pages
// writable again and cleared its entries.
std::atomic<uint64_t> g_releases{0};  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

// The last fault this thread was sent back to retry: a second fault at the
// same address with no Release between is not a stale one.
struct Retried {
  uintptr_t addr = 0;
  uint64_t releases = 0;
  int sig = 0;
  bool any = false;
};
thread_local Retried t_retried;

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

// A fault that no guarded copy and no watched page owns may still be ours: a
// write that faulted on a watched page while another thread's Release was
// making it writable reaches the handler after its entry is gone. The
// access is then allowed (the copy has ended), so the handler returns and the
// instruction runs again, without touching the signal disposition. A fault
// that comes back at the same address with no Release in between is genuine
// (or the retry was not needed: a fault that is not ours repeats) and goes
// to the handler that was there before mhckpt, or ends the process as it
// would have. Signals sent by a process (si_code <= 0) are never retried.
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
  if (info->si_code > 0) {
    const uint64_t releases = g_releases.load(std::memory_order_acquire);
    Retried& r = t_retried;
    if (!r.any || r.addr != addr || r.releases != releases || r.sig != sig) {
      r = {addr, releases, sig, true};
      return;  // the access runs again
    }
  }
  Chain(sig, info, context);
  t_retried.any = false;  // a handler before mhckpt's dealt with it
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

// One run of a mapping in /proc/self/maps: [lo, hi) and its protection.
struct Run {
  uintptr_t lo, hi;
  int prot;
};

// The mappings of the process, in address order; nullopt if
// /proc/self/maps cannot be read.
std::optional<std::vector<Run>> Mappings() {
  std::ifstream maps("/proc/self/maps");
  if (!maps) return std::nullopt;
  std::vector<Run> runs;
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;  // NOLINT(google-runtime-int): sscanf's %lx
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    int prot = PROT_NONE;
    if (perms[0] == 'r') prot |= PROT_READ;
    if (perms[1] == 'w') prot |= PROT_WRITE;
    if (perms[2] == 'x') prot |= PROT_EXEC;
    runs.push_back({lo, hi, prot});
  }
  return runs;
}

// The runs of [begin, end) with their protection now, clipped to it; a part
// no mapping covers is a run with prot -1.
std::vector<Run> RunsOf(const std::optional<std::vector<Run>>& maps, uintptr_t begin,
                        uintptr_t end) {
  // Without /proc: every page is taken as readable and writable.
  if (!maps) return {{begin, end, PROT_READ | PROT_WRITE}};
  std::vector<Run> out;
  uintptr_t at = begin;
  for (const Run& m : *maps) {
    if (m.hi <= at || m.lo >= end) continue;
    if (m.lo > at) out.push_back({at, m.lo, -1});
    const uintptr_t hi = std::min(m.hi, end);
    out.push_back({std::max(m.lo, at), hi, m.prot});
    at = hi;
    if (at >= end) break;
  }
  if (at < end) out.push_back({at, end, -1});
  return out;
}

// Runs `body` with this thread's guard set: false if it faulted reading
// memory (the handler jumps back here), true once it returned.
template <typename Body>
bool RunGuarded(const Body& body) {
  InstallHandler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &jump;
  body();
  t_guard = nullptr;
  return true;
}

}  // namespace

bool GuardedCopy(void* dst, const void* src, size_t bytes) {
  return RunGuarded([&] { std::memcpy(dst, src, bytes); });
}

bool GuardedCopyUncached(void* dst, const void* src, size_t bytes,
                         const std::function<void(const void*, size_t)>& read) {
  return RunGuarded([&] {
    CopyUncached(dst, src, bytes);
    read(src, bytes);
  });
}

WriteWatch::~WriteWatch() { Release(); }

Status WriteWatch::Protect(const std::vector<Range>& ranges) {
  InstallHandler();
  const size_t page = PageSize();
  const std::optional<std::vector<Run>> maps = Mappings();
  for (const Range& r : ranges) {
    const auto lo = reinterpret_cast<uintptr_t>(r.data);
    const uintptr_t begin = (lo + page - 1) / page * page;
    const uintptr_t end = (lo + r.bytes) / page * page;
    if (r.data == nullptr || end <= begin) continue;  // no whole page inside
    for (const Run& run : RunsOf(maps, begin, end)) {
      // NOLINTNEXTLINE(performance-no-int-to-ptr)
      void* p = reinterpret_cast<void*>(run.lo);
      if (run.prot < 0) {
        Release();
        return IoError(fmt::format("cannot write-protect {} bytes at {} ({}): {}", run.hi - run.lo,
                                   p, r.message, std::strerror(ENOMEM)));
      }
      // Pages that were not writable stay as they are, unwatched: a write
      // to them faults as it would without mhckpt.
      if ((run.prot & PROT_WRITE) == 0) continue;
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
          e.lo.store(run.lo, std::memory_order_relaxed);
          e.hi.store(run.hi, std::memory_order_release);
        }
      }
      if (id < 0) {
        Release();
        return InvalidArgument(
            fmt::format("more than {} buffers write-protected at once (SaveOptions::protect_host)",
                        kMaxEntries));
      }
      ids_.push_back(id);
      if (mprotect(p, run.hi - run.lo, run.prot & ~PROT_WRITE) != 0) {
        const int err = errno;
        Release();
        return IoError(fmt::format("cannot write-protect {} bytes at {} ({}): {}", run.hi - run.lo,
                                   p, r.message, std::strerror(err)));
      }
      spans_.push_back({p, run.hi - run.lo, run.prot});
    }
  }
  return OkStatus();
}

void WriteWatch::Release() {
  // The pages first, then the entries: a write that faulted before the
  // entry is gone is reported (it was made while the page was watched); one
  // whose fault is handled after finds the page writable again on its retry.
  for (const Span& s : spans_) mprotect(s.begin, s.bytes, s.prot);
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
  g_releases.fetch_add(1, std::memory_order_release);
}

size_t WriteWatch::watched_bytes() const {
  size_t n = 0;
  for (const Span& s : spans_) n += s.bytes;
  return n;
}

}  // namespace mhckpt::internal
