#include "io/root_lock.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/fault.h"
#include "io/layout.h"
#include "io/posix_file.h"

namespace mhckpt::io {
namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Join(const std::string& root, std::string_view name) {
  return root + "/" + std::string(name);
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string JobId() {
  for (const char* var : {"SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return v;
  }
  return "";
}

std::string BootId() {
  Result<std::string> id = ReadSmallFile("/proc/sys/kernel/random/boot_id", 256);
  if (!id.ok()) return "";
  std::string out = *id;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// True if `holder` ran under this kernel (the same boot of the same
// machine, containers included): the kernel's flock reaches it, so a lock
// granted to us means it is gone — exited, killed, or a zombie being
// reaped. Without boot ids, the host names decide.
bool SameKernel(const Lease& holder, const Lease& self) {
  if (!holder.boot_id.empty() && !self.boot_id.empty()) return holder.boot_id == self.boot_id;
  return holder.host == self.host;
}

bool PidExists(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH);
}

// The lease in `root`, or nullopt if there is none or it is unreadable (a
// crash mid-write): then the lock alone decides.
std::optional<Lease> ReadLease(const std::string& root) {
  Result<std::string> text = ReadSmallFile(Join(root, kLeaseFileName), kMaxLeaseBytes);
  if (!text.ok()) return std::nullopt;
  Result<Lease> lease = ParseLease(*text);
  if (!lease.ok()) return std::nullopt;
  return *lease;
}

Status InUse(const std::string& root, const std::optional<Lease>& holder, const std::string& why) {
  return FailedPrecondition(fmt::format(
      "checkpoint root '{}' is in use by another job ({}): {}; Open changed nothing in it", root,
      holder ? DescribeHolder(*holder, NowUnixMs()) : std::string("no lease written yet"), why));
}

struct Taken {
  int fd = -1;                  // holds the lock
  std::optional<Lease> before;  // the lease taken over, if any
};

// One try of steps 1-3: the lock, or the Status saying why not.
Result<Taken> TryOnce(const std::string& root, const Lease& self, double lease_seconds) {
  // 1. Lock.
  bool no_locks = false;
  MHCKPT_ASSIGN_OR_RETURN(std::optional<int> fd, TryLockFile(Join(root, kLockFileName), &no_locks));
  if (!fd)
    return InUse(root, ReadLease(root), "it holds the lock on " + std::string(kLockFileName));
  // 2. Lease.
  std::optional<Lease> holder = ReadLease(root);
  if (holder && !(holder->host == self.host && holder->pid == self.pid)) {
    const double age = static_cast<double>(NowUnixMs() - holder->heartbeat_unix_ms) / 1000;
    // Without locks, a holder of this kernel is gone only if its pid is.
    const bool gone = SameKernel(*holder, self) && (!no_locks || !PidExists(holder->pid));
    if (age < lease_seconds && !gone) {
      UnlockFile(*fd);
      return InUse(root, holder,
                   fmt::format("{}, and its lease's heartbeat is younger than the lease time "
                               "of {} s",
                               no_locks ? "the file system has no locks (flock is not supported)"
                                        : "it runs on another machine, where the lock does not "
                                          "reach it (a file system without working locks?)",
                               lease_seconds));
    }
  }
  // 3. Own.
  Status written = WriteFileReplacing(Join(root, kLeaseFileName), LeaseToJson(self));
  if (!written.ok()) {
    UnlockFile(*fd);
    return written;
  }
  if (holder && holder->host == self.host && holder->pid == self.pid) holder.reset();
  return Taken{*fd, std::move(holder)};
}

}  // namespace

std::string LeaseToJson(const Lease& lease) {
  nlohmann::json j = {{"host", lease.host},
                      {"pid", lease.pid},
                      {"job", lease.job},
                      {"boot_id", lease.boot_id},
                      {"started_unix_ms", lease.started_unix_ms},
                      {"heartbeat_unix_ms", lease.heartbeat_unix_ms}};
  // An environment variable may hold bytes that are not UTF-8: replace them.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<Lease> ParseLease(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("lease: not a JSON object");
  Lease l;
  try {
    l.host = j.at("host").get<std::string>();
    l.pid = j.at("pid").get<int64_t>();
    l.job = j.at("job").get<std::string>();
    l.boot_id = j.value("boot_id", std::string());
    l.started_unix_ms = j.at("started_unix_ms").get<int64_t>();
    l.heartbeat_unix_ms = j.at("heartbeat_unix_ms").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(fmt::format("lease: {}", e.what()));
  }
  return l;
}

std::string DescribeHolder(const Lease& lease, int64_t now_unix_ms) {
  return fmt::format("host '{}', pid {}{}, heartbeat {:.1f} s ago", lease.host, lease.pid,
                     lease.job.empty() ? std::string() : fmt::format(", job '{}'", lease.job),
                     static_cast<double>(now_unix_ms - lease.heartbeat_unix_ms) / 1000);
}

Lease CurrentProcessLease() {
  const int64_t now = NowUnixMs();
  return Lease{HostName(), static_cast<int64_t>(::getpid()), JobId(), BootId(), now, now};
}

Result<std::unique_ptr<RootLock>> RootLock::Acquire(const std::string& root,
                                                    const RootLockOptions& options) {
  const Lease self = CurrentProcessLease();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(std::max(0.0, options.wait_seconds));
  for (;;) {
    Result<Taken> taken = TryOnce(root, self, options.lease_seconds);
    if (taken.ok()) {
      return std::unique_ptr<RootLock>(
          new RootLock(root, taken->fd, self, std::move(taken->before), options.lease_seconds));
    }
    if (taken.status().code() != StatusCode::kFailedPrecondition ||
        std::chrono::steady_clock::now() >= deadline) {
      return taken.status();
    }
    // In use, and waiting for the holder to leave: a test's gate.
    MHCKPT_RETURN_IF_ERROR(fault::Hit("root_busy"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

RootLock::RootLock(std::string root, int fd, Lease lease, std::optional<Lease> taken_over,
                   double lease_seconds)
    : root_(std::move(root)),
      fd_(fd),
      lease_(std::move(lease)),
      taken_over_(std::move(taken_over)),
      lease_seconds_(lease_seconds) {
  heartbeat_ = std::thread([this] { Renew(); });
}

RootLock::~RootLock() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  heartbeat_.join();
  RemoveFile(Join(root_, kLeaseFileName)).IgnoreError();  // best effort: a stale lease is harmless
  UnlockFile(fd_);
}

// The heartbeat: rewrites the lease every quarter of the lease time. A failed
// write is retried at the next beat; a lease that stays stale lets another
// job take the root only where the lock does not reach (see the top of
// root_lock.h).
void RootLock::Renew() {
  const auto period = std::chrono::duration<double>(std::max(0.05, lease_seconds_ / 4));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period, [this] { return stop_; })) {
    lease_.heartbeat_unix_ms = NowUnixMs();
    WriteFileReplacing(Join(root_, kLeaseFileName), LeaseToJson(lease_)).IgnoreError();
  }
}

}  // namespace mhckpt::io
