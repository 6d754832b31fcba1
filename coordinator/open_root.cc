#include "coordinator/open_root.h"

#include <xxhash.h>

#include <cmath>
#include <iterator>
#include <vector>

#include <fmt/format.h>

#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/input_checks.h"
#include "coordinator/root_upkeep.h"
#include "coordinator/shared_commit.h"

namespace mhckpt::internal {
namespace {

// The options that decide which collective calls a save makes (the replica
// check; the collective write rounds) must be the same on every rank, or
// ranks would wait in different calls; and so must the root, which every
// rank reads and writes.
Status AgreeOnSharedInputs(const std::string& root, const Options& o, const Comm& comm) {
  const int64_t transfer = static_cast<int64_t>(o.transfer), verify = o.verify_replicas ? 1 : 0;
  const auto root_hash = static_cast<int64_t>(XXH3_64bits(root.data(), root.size()) >> 2);
  // The local tier: on or off, and the options that decide its protocol.
  const int64_t local = o.local_dir.empty() ? 0 : 1;
  const auto deadline_ms = static_cast<int64_t>(o.persistent_deadline_seconds * 1000);
  std::vector<int64_t> votes{transfer,
                             -transfer,
                             verify,
                             -verify,
                             root_hash,
                             -root_hash,
                             local,
                             -local,
                             o.persistent_every,
                             -o.persistent_every,
                             o.local_copies,
                             -o.local_copies,
                             o.local_max_to_keep,
                             -o.local_max_to_keep,
                             o.local_parity_group,
                             -o.local_parity_group,
                             deadline_ms,
                             -deadline_ms,
                             o.files.ranks_per_file,
                             -o.files.ranks_per_file,
                             o.save_interval_steps,
                             -o.save_interval_steps,
                             o.save_continuously ? 1 : 0,
                             o.save_continuously ? -1 : 0};
  comm.AllreduceMax(&votes);  // max and -min of each
  const char* what[] = {"Options::transfer",
                        "Options::verify_replicas",
                        "the root path",
                        "Options::local_dir (set or not)",
                        "Options::persistent_every",
                        "Options::local_copies",
                        "Options::local_max_to_keep",
                        "Options::local_parity_group",
                        "Options::persistent_deadline_seconds",
                        "Options::files",
                        "Options::save_interval_steps",
                        "Options::save_continuously"};
  for (size_t i = 0; i < std::size(what); ++i) {
    if (votes[2 * i] != -votes[2 * i + 1]) {
      return InvalidArgument(fmt::format("{} differs between ranks", what[i]));
    }
  }
  return OkStatus();
}

// The options of ShouldSave and the preemption handlers: counts not
// negative, durations finite and not negative.
Status CheckSavePolicy(const Options& o, int rank) {
  auto bad = [&](const char* what, double v) {
    return InvalidArgument(
        fmt::format("rank {}: Options::{} is {}; it must be a finite number >= 0", rank, what, v));
  };
  if (o.save_interval_steps < 0) {
    return bad("save_interval_steps", static_cast<double>(o.save_interval_steps));
  }
  if (!(o.min_save_interval_seconds >= 0) || !std::isfinite(o.min_save_interval_seconds)) {
    return bad("min_save_interval_seconds", o.min_save_interval_seconds);
  }
  if (!(o.preemption.grace_seconds >= 0) || !std::isfinite(o.preemption.grace_seconds)) {
    return bad("preemption.grace_seconds", o.preemption.grace_seconds);
  }
  return OkStatus();
}

// Why this rank does not see, in `store`, the root that rank 0 opened
// (whose lease text is `lease_text`; empty without ownership), or "".
std::string RootNotShared(io::RootStore& store, const std::string& lease_text) {
  if (!store.Exists()) return "it does not exist here";
  if (lease_text.empty()) return "";
  const Result<io::Lease> theirs = io::ParseLease(lease_text);
  if (!theirs.ok()) return "";  // rank 0 could not read its own lease back: nothing to compare
  const Result<std::string> text = store.LeaseText();
  const Result<io::Lease> here =
      text.ok() ? io::ParseLease(*text) : Result<io::Lease>(text.status());
  if (!here.ok()) return fmt::format("rank 0's lease is not there ({})", here.status().message());
  if (here->host != theirs->host || here->pid != theirs->pid ||
      here->started_unix_ms != theirs->started_unix_ms) {
    return fmt::format("the lease there is another process's ({})",
                       io::DescribeHolder(*here, here->heartbeat_unix_ms));
  }
  return "";
}

// "rank 0: " before a status's message.
Status OnRank0(const Status& s) {
  return s.ok() ? s : Status(s.code(), fmt::format("rank 0: {}", s.message()));
}

}  // namespace

Status PrepareRoot(io::RootStore& store, const Options& options,
                   std::unique_ptr<io::RootOwnership>* lock) {
  if (options.own_root && !(options.root_lease_seconds > 0)) {
    return InvalidArgument(fmt::format("Options::root_lease_seconds is {}; it must be positive",
                                       options.root_lease_seconds));
  }
  const std::string& root = store.root();
  MHCKPT_RETURN_IF_ERROR(OnRank0(store.Create()));
  if (!options.own_root) return OkStatus();
  MHCKPT_RETURN_IF_ERROR(OnRank0(store.CheckWritable()));
  MHCKPT_ASSIGN_OR_RETURN(*lock,
                          store.Acquire({options.root_lease_seconds, options.root_wait_seconds}));
  if (const auto& before = (*lock)->taken_over()) {
    const int64_t now = NowUnixMs();
    Logger()->warn("mhckpt: took over {}: its previous owner ({}) is gone or its lease is stale",
                   root, io::DescribeHolder(*before, now));
  }
  if (!options.remove_uncommitted_on_open) return OkStatus();
  // Steps without a marker, and retired steps whose removal a previous job
  // did not finish.
  return RemoveLeftovers(store, /*log=*/true);
}

Status AgreeRootIsShared(io::RootStore& store, bool own_root, const Comm& comm) {
  const std::string& root = store.root();
  std::string lease_text;
  if (comm.rank() == 0 && own_root) {
    Result<std::string> text = store.LeaseText();
    if (text.ok()) lease_text = std::move(text).value();
  }
  comm.BroadcastBytes(&lease_text, 0);
  Status s;
  if (comm.rank() != 0) {
    s = Guarded(fmt::format("rank {}: open", comm.rank()), [&] {
      const std::string why = RootNotShared(store, lease_text);
      if (why.empty()) return OkStatus();
      return FailedPrecondition(fmt::format(
          "rank {} on host '{}' does not see the root '{}' that rank 0 opened: {}; the root "
          "must be on a file system that every rank sees (not node-local storage)",
          comm.rank(), io::CurrentProcessLease().host, root, why));
    });
  }
  return AgreeAll(s, comm);
}

Status AgreeOpenInputs(const std::string& root, const Options& options, const Comm& comm) {
  Status s = CheckOptions(options, comm.rank());
  if (s.ok()) s = CheckSavePolicy(options, comm.rank());
  if (s.ok()) s = CheckRootPath(root, comm.rank());
  if (s.ok() && options.local_dir == root) {
    s = InvalidArgument(
        fmt::format("rank {}: Options::local_dir is the root '{}' itself", comm.rank(), root));
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm));
  return AgreeOnSharedInputs(root, options, comm);
}

}  // namespace mhckpt::internal
