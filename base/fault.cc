#include "base/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace mhckpt::fault {
namespace {

struct Fault {
  int rank = -1;  // -1: any
  std::string point;
  std::string action;
  uint64_t after_bytes = 0;
  int64_t step = -1;   // -1: any
  int64_t times = -1;  // how many more times it fires; -1: always
  std::string file;    // action=wait: the file whose creation ends the wait
};

std::mutex g_mu;
std::vector<Fault> g_faults;
std::atomic<int> g_rank{-1};
std::atomic<int64_t> g_fired{0};
// Per thread: the caller's thread and the I/O thread each set the step they are
// working on, so that with asynchronous saves a `step=` filter matches the
// save that reaches the point, not the one most recently started.
thread_local int64_t g_step = -1;

Result<std::vector<Fault>> Parse(const std::string& spec) {
  std::vector<Fault> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(';', pos);
    if (end == std::string::npos) end = spec.size();
    std::string one = spec.substr(pos, end - pos);
    pos = end + 1;
    if (one.empty()) continue;
    Fault f;
    size_t p = 0;
    while (p < one.size()) {
      size_t e = one.find(',', p);
      if (e == std::string::npos) e = one.size();
      std::string kv = one.substr(p, e - p);
      p = e + 1;
      size_t eq = kv.find('=');
      if (eq == std::string::npos)
        return InvalidArgument(fmt::format("fault spec '{}': '{}' is not key=value", spec, kv));
      std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      auto number = [&](auto* out_value) {
        auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), *out_value);
        return ec == std::errc() && ptr == v.data() + v.size();
      };
      bool ok = true;
      if (k == "rank")
        ok = number(&f.rank);
      else if (k == "point")
        f.point = v;
      else if (k == "action")
        f.action = v;
      else if (k == "after_bytes")
        ok = number(&f.after_bytes);
      else if (k == "step")
        ok = number(&f.step);
      else if (k == "times")
        ok = number(&f.times);
      else if (k == "file")
        f.file = v;
      else
        ok = false;
      if (!ok) return InvalidArgument(fmt::format("fault spec '{}': bad '{}'", spec, kv));
    }
    if (f.point.empty() || f.action.empty()) {
      return InvalidArgument(fmt::format("fault spec '{}': point and action are required", spec));
    }
    if ((f.action == "wait") != !f.file.empty()) {
      return InvalidArgument(fmt::format("fault spec '{}': file= goes with action=wait", spec));
    }
    out.push_back(std::move(f));
  }
  return out;
}

int ErrnoOf(const std::string& action) {
  if (action == "enospc") return ENOSPC;
  if (action == "eio") return EIO;
  if (action == "eacces") return EACCES;
  if (action == "eintr") return EINTR;
  return 0;
}

// The fault configured for `point` on this rank and step, if any; counts one
// firing against its `times`. A `short` fault is matched only by ShortSlow
// (`want_short`), the others only by Hit and Errno.
const Fault* Match(std::string_view point, uint64_t bytes, bool want_short = false) {
  for (Fault& f : g_faults) {
    if (f.point != point || (f.action == "short") != want_short) continue;
    if (f.rank >= 0 && f.rank != g_rank.load()) continue;
    if (f.step >= 0 && f.step != g_step) continue;
    if (bytes < f.after_bytes) continue;
    if (f.times == 0) continue;
    if (f.times > 0) --f.times;
    g_fired.fetch_add(1);
    return &f;
  }
  return nullptr;
}

bool LoadFromEnvironment() {
  const char* spec = std::getenv("MHCKPT_FAULT");
  if (spec == nullptr || *spec == '\0') return false;
  auto faults = Parse(spec);
  if (!faults.ok()) {
    std::fprintf(stderr, "mhckpt: ignoring MHCKPT_FAULT: %s\n", faults.status().ToString().c_str());
    return false;
  }
  g_faults = std::move(faults).value();
  return true;
}

}  // namespace

namespace internal {

std::atomic<bool> g_enabled{LoadFromEnvironment()};

Status HitSlow(std::string_view point, uint64_t bytes) {
  std::unique_lock<std::mutex> lock(g_mu);
  const Fault* f = Match(point, bytes);
  if (f == nullptr) return OkStatus();
  if (f->action == "exit") {
    std::fprintf(stderr, "mhckpt: injected exit at %.*s on rank %d\n",
                 static_cast<int>(point.size()), point.data(), g_rank.load());
    _exit(41);
  }
  if (f->action == "kill") {
    std::fprintf(stderr, "mhckpt: injected SIGKILL at %.*s on rank %d\n",
                 static_cast<int>(point.size()), point.data(), g_rank.load());
    kill(getpid(), SIGKILL);
    pause();
  }
  if (f->action == "hang") {
    std::fprintf(stderr, "mhckpt: injected hang at %.*s on rank %d\n",
                 static_cast<int>(point.size()), point.data(), g_rank.load());
    for (;;) sleep(1000);
  }
  if (f->action == "wait") {
    // A test's gate: say that the point is reached, then wait for the file.
    const std::string file = f->file;
    lock.unlock();  // other threads' points go on meanwhile
    std::fprintf(stderr, "mhckpt: injected wait at %.*s on rank %d for %s\n",
                 static_cast<int>(point.size()), point.data(), g_rank.load(), file.c_str());
    if (FILE* reached = std::fopen((file + ".reached").c_str(), "w")) std::fclose(reached);
    while (::access(file.c_str(), F_OK) != 0) ::usleep(20000);
    return OkStatus();
  }
  if (int e = ErrnoOf(f->action)) {
    return IoError(fmt::format("{} (injected at {})", std::strerror(e), point));
  }
  return Internal(fmt::format("injected failure at {}", point));
}

int ErrnoSlow(std::string_view point) {
  std::lock_guard<std::mutex> lock(g_mu);
  const Fault* f = Match(point, 0);
  return f ? ErrnoOf(f->action) : 0;
}

size_t ShortSlow(std::string_view point, size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  return Match(point, 0, /*want_short=*/true) != nullptr ? std::max<size_t>(n / 2, 1) : n;
}

}  // namespace internal

Status Configure(const std::string& spec) {
  MHCKPT_ASSIGN_OR_RETURN(std::vector<Fault> faults, Parse(spec));
  std::lock_guard<std::mutex> lock(g_mu);
  g_faults = std::move(faults);
  g_fired = 0;
  internal::g_enabled.store(!g_faults.empty());
  return OkStatus();
}

void SetRank(int rank) { g_rank = rank; }
int64_t Fired() { return g_fired.load(); }
void SetStep(int64_t step) { g_step = step; }

}  // namespace mhckpt::fault
