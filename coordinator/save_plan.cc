// Steps 1-2 of the save protocol (coordinator/save.cc): SaveRun's phases on
// the I/O thread, with its communicator.
//   1. Plan. One allreduce: if every rank holds what it held at the previous
//      save and all save the same step, the previous plan is reused (ranks
//      that disagree on the tier fail the save). Otherwise every rank sends
//      rank 0 a digest of its description, and the first rank of each
//      distinct digest the description itself (coordinator/layouts.h);
//      rank 0 plans (coordinator/plan.h), refuses a step committed in either
//      tier, creates the step in the shared root (not in drain mode: the
//      drain thread does), and broadcasts the outcome and the plan; every
//      rank agrees that it could read it.
//   2. Replica check (Options::verify_replicas). Every rank sends rank 0 the
//      checksums of the planned boxes it holds; rank 0 compares the boxes
//      held by several ranks and broadcasts the outcome.
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/checksum.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/layouts.h"
#include "coordinator/plan.h"
#include "coordinator/save_run.h"
#include "coordinator/shared_commit.h"
#include "io/layout.h"
#include "io/root_store.h"

namespace mhckpt::internal {
namespace {

// Rank 0: refuses a step committed in either tier; for a save to the shared
// root, creates the step there afresh (what an earlier failed attempt at this
// step left is garbage).
// In drain mode (`shared` false) the shared root is not touched here: the
// drain thread creates the step there (ManagerImpl::SaveRun::Drain), so that
// a stuck shared file system cannot hold the I/O thread.
Status PrepareStep(io::RootStore& store, const LocalTier* local, int64_t step, bool persistent,
                   bool shared = true) {
  if (local != nullptr && local->Find(step) != nullptr) {
    return AlreadyExists(fmt::format("step {} is committed in the local tier", step));
  }
  if (!shared) return OkStatus();
  if (persistent) return store.CreateStep(step);
  Result<std::string> marker = store.GetMarker(step);
  if (marker.ok()) {
    return AlreadyExists(fmt::format("step {} is committed in '{}'", step, store.root()));
  }
  return marker.status().code() == StatusCode::kNotFound ? OkStatus() : marker.status();
}

// Rank 0's part of the plan round: `encoded` holds the description of the
// first rank of each layout (coordinator/layouts.h).
// The plan uses rank 0's Options::replica_parallel_min_bytes and
// checksum_chunk_bytes: the plan is made here and broadcast, so a different value on another rank
// is ignored.
Result<io::Marker> PlanOnRoot(const std::vector<std::string>& encoded, const LayoutGroups& groups,
                              io::RootStore& store, const LocalTier* local, int64_t step,
                              bool persistent, bool shared, const Options& options) {
  MHCKPT_ASSIGN_OR_RETURN(io::Marker plan,
                          PlanLayouts(encoded, groups, options.replica_parallel_min_bytes,
                                      options.checksum_chunk_bytes));
  if (plan.format_version != options.format_version) {
    io::PlanChunks(&plan, plan.chunk_bytes, options.format_version);
  }
  MHCKPT_RETURN_IF_ERROR(PrepareStep(store, local, step, persistent, shared));
  return plan;
}

// A rank's description may not exceed this: rank 0 gathers every rank's
// (MPI counts are ints), and kMaxArraysPerSave / kMaxShardsPerRank keep a
// valid one far below it.
constexpr size_t kMaxDescriptionBytes = size_t{1} << 30;

// Checksums of every planned box this rank holds, written by it or not. A
// box split into row slices (replica-parallel saving) is compared slice by
// slice: every holder of the box holds every slice, so all of the box is
// compared across all of its holders.
std::vector<BoxSum> HoldingChecksums(const io::Marker& plan, const Snapshot& snapshot) {
  const auto staged = StagedByName(snapshot);
  std::vector<BoxSum> sums;
  for (size_t i = 0; i < plan.arrays.size(); ++i) {
    auto it = staged.find(plan.arrays[i].name);
    for (size_t k = 0; it != staged.end() && k < plan.arrays[i].boxes.size(); ++k) {
      std::span<const std::byte> bytes =
          FindStaged(snapshot, it->second, plan.arrays[i].boxes[k].box);
      if (bytes.data() != nullptr) {
        sums.push_back({static_cast<uint32_t>(i),
                        static_cast<uint32_t>(k),
                        Checksum(bytes.data(), bytes.size()),
                        {}});
      }
    }
  }
  return sums;
}

// Rank 0: the boxes held by several ranks must be equal everywhere.
Status CompareReplicas(const io::Marker& plan, const std::vector<std::vector<BoxSum>>& sums) {
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, int>> first;  // box -> (sum, rank)
  for (size_t r = 0; r < sums.size(); ++r) {
    for (const BoxSum& b : sums[r]) {
      auto [it, inserted] = first.try_emplace({b.array, b.box}, b.sum, static_cast<int>(r));
      if (!inserted && it->second.first != b.sum) {
        const io::MarkerArray& a = plan.arrays[b.array];
        return DataLoss(
            fmt::format("replicas differ: array '{}' box {} is {} on rank {} but {} on rank {}",
                        a.name, BoxToString(a.boxes[b.box].box), ChecksumToString(it->second.first),
                        it->second.second, ChecksumToString(b.sum), r));
      }
    }
  }
  return OkStatus();
}

}  // namespace

Status ManagerImpl::SaveRun::Plan(const Comm& comm) {
  const uint64_t hash = job_.local.ok() ? DescriptionHash(job_.snapshot) : 0;
  int64_t changed =
      impl_.last_plan_ && job_.local.ok() && hash == impl_.last_description_hash_ ? 0 : 1;
  if (rank_ == 0 && !changed &&
      !PrepareStep(*impl_.store_, impl_.local_.get(), job_.step, job_.persistent,
                   !impl_.DrainMode())
           .ok()) {
    changed = 1;  // the plan round reports why
  }
  // Why one allreduce: it confirms that nobody's arrays changed and that all
  // ranks save the same step (max(step) == -max(-step)). A rank with an
  // error (perhaps a step of INT64_MIN, which has no negation) votes
  // "changed" with step 0: the plan round then reports its error.
  const int64_t step = job_.local.ok() ? job_.step : 0;
  const int64_t persistent = job_.persistent ? 1 : 0;
  std::vector<int64_t> votes{changed, step, -step, persistent, -persistent};
  comm.AllreduceMax(&votes);
  if (votes[3] != -votes[4]) {
    if (rank_ == 0 && !changed) RemoveStepDir();
    return InvalidArgument(
        fmt::format("save of step {}: ranks disagree on its tier (SaveOptions::tier)", job_.step));
  }
  t_.plan_cached = votes[0] == 0 && votes[1] == -votes[2];
  if (t_.plan_cached) {
    plan_ = *impl_.last_plan_;
    plan_.step = job_.step;
  } else {
    if (rank_ == 0 && !changed) RemoveStepDir();
    MHCKPT_RETURN_IF_ERROR(GatherPlan(comm));
    impl_.last_plan_ = plan_;
    impl_.last_description_hash_ = hash;
  }
  plan_.user_metadata = job_.metadata;  // rank 0's is the one written
  plan_.preemption = job_.preemption;
  return OkStatus();
}

Status ManagerImpl::SaveRun::GatherPlan(const Comm& comm) {
  const std::string mine = MyDescription();
  std::vector<std::string> digests = comm.GatherBytes(LayoutDigest(mine), 0);
  LayoutGroups groups;
  std::vector<int> send;
  if (rank_ == 0) {
    groups = GroupLayouts(digests);
    send.assign(digests.size(), 0);
    for (int r : groups.first_rank) send[static_cast<size_t>(r)] = 1;
  }
  const bool sender = comm.ScatterInt(send, 0) != 0;
  std::vector<std::string> encoded = comm.GatherBytes(sender ? mine : std::string(), 0);
  Status s;
  std::string plan_json;
  if (rank_ == 0) {
    // Guarded: an exception here would leave every other rank waiting
    // for rank 0's outcome.
    s = Guarded("rank 0: plan", [&] {
      Result<io::Marker> p =
          PlanOnRoot(encoded, groups, *impl_.store_, impl_.local_.get(), job_.step, job_.persistent,
                     !impl_.DrainMode(), impl_.options_);
      if (!p.ok()) return p.status();
      plan_ = std::move(p).value();
      plan_json = io::MarkerToJson(plan_, io::MarkerText::kPlan);
      return OkStatus();
    });
    if (s.code() == StatusCode::kIoError)
      s = Status(s.code(), fmt::format("rank 0: {}", s.message()));
    if ((s.code() == StatusCode::kIoError || s.code() == StatusCode::kInternal) &&
        job_.persistent && !impl_.DrainMode()) {
      RemoveStepDir();
    }
    if (!s.ok()) plan_json.clear();
  }
  MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, comm));
  comm.BroadcastBytes(&plan_json, 0);
  Status parsed;
  if (rank_ != 0) {
    Result<io::Marker> p = io::ParseMarker(plan_json, "plan", io::MarkerText::kPlan);
    if (p.ok()) {
      plan_ = std::move(p).value();
    } else {
      parsed = Internal(
          fmt::format("rank {}: cannot read rank 0's plan: {}", rank_, p.status().message()));
    }
  }
  // Why an agreement: a rank that cannot read the plan must not leave the
  // others alone in the collective calls of the write.
  return AgreeAll(parsed, comm);
}

std::string ManagerImpl::SaveRun::MyDescription() {
  std::string bytes;
  Status s = Guarded(fmt::format("rank {}: describe", rank_), [&] {
    bytes = EncodeDescription(internal::Describe(job_.step, job_.local, job_.snapshot));
    if (bytes.size() > kMaxDescriptionBytes) {
      return InvalidArgument(
          fmt::format("rank {}: the description of this rank's arrays is {} bytes, more than {}",
                      rank_, bytes.size(), kMaxDescriptionBytes));
    }
    return OkStatus();
  });
  if (s.ok()) return bytes;
  return EncodeDescription(RankDescription{job_.step, s, {}});
}

Status ManagerImpl::SaveRun::CheckReplicas(const Comm& comm) {
  std::vector<std::string> held =
      comm.GatherBytes(EncodeReport(OkStatus(), HoldingChecksums(plan_, job_.snapshot)), 0);
  Status s;
  if (rank_ == 0) {
    s = Guarded("rank 0: replica check", [&] {
      std::vector<std::vector<BoxSum>> all;
      MHCKPT_RETURN_IF_ERROR(CollectReports(held, &all));
      MHCKPT_RETURN_IF_ERROR(CheckSumsInPlan(plan_, all));
      return CompareReplicas(plan_, all);
    });
    if (!s.ok()) RemoveStepDir();
  }
  return BroadcastStatus(s, 0, comm);
}

}  // namespace mhckpt::internal
