// The save protocol of one step, run by every rank on its I/O thread after
// Save has copied the rank's boxes into a Snapshot:
//
//   1. Plan. If every rank holds exactly the arrays and boxes of the
//      previous save, one allreduce confirms it (and that all ranks save the
//      same step) and the previous plan is reused. Otherwise every rank sends
//      rank 0 a digest of its description of what it holds (and its local
//      input error, if any), and the lowest rank of each distinct digest the
//      description itself (coordinator/layouts.h); rank 0 validates all of them together, picks one
//      writer per distinct box (coordinator/plan.h), refuses a step that is already committed,
//      creates the step directory (fsyncing the root), and broadcasts the outcome and the plan;
//      every rank agrees that it could read the plan.
//      Either collective is also the barrier of the design: a rank enters it only after its
//      snapshot is complete, so nobody writes before every snapshot exists.
//   2. Replica check (Options::verify_replicas). Every rank sends rank 0 the
//      checksums of the planned boxes it holds; boxes held by several ranks
//      must be equal everywhere before anything is written.
//   3. Write. All ranks create the step (and agree that they could) and its
//      arrays through the storage engine (io/storage.h; the direct engine's
//      rank 0 lays the file out alone and broadcasts the offsets); rank 0
//      reserves their space on disk and all agree on it and on the arrays,
//      so a full disk fails here and not inside a collective flush; then
//      each rank writes the boxes the plan gives it
//      (fully replicated arrays: rank 0; with
//      Options::replica_parallel_min_bytes, big shared boxes as row slices,
//      one per holder, each from the holder's own staged copy). A write
//      error is remembered, and the rank keeps taking part. The staging
//      buffer goes back to the pool as soon as the rank's writes are done.
//   4. Flush. The engine makes the step durable and closes it (the direct
//      engine: one fsync of the file per rank; the HDF5
//      engine: H5Fflush(GLOBAL), which syncs through MPI-IO, then H5Fclose).
//   5. Agree. One gather: every rank's outcome, and the checksums (XXH3) of
//      the boxes it wrote, which go into the marker.
//   6. Commit. Rank 0 makes the step's names durable before the marker's
//      (io::RootStore::SyncStep: fsync the step directory), puts the marker
//      (io::RootStore::PutMarker: temp file, fsync, rename, fsync the
//      directory), or on failure removes the step (RemoveStep), and
//      broadcasts the outcome; every rank returns it.
//      (The reservation of step 3 is exact: nothing to give back.)
//   7. Retention (coordinator/retention.h). After the outcome is recorded,
//      so off the path to the commit, rank 0's I/O thread retires the steps
//      the policy no longer keeps (marker first, then the directory renamed
//      out of the listing: io::RootStore::RetireStep) before it runs any
//      later job;
//      its deleter thread frees their files in the background. A failure
//      here is logged, not returned: the new step is committed either way.
//
// With Options::local_dir, the save commits in the local tier between steps
// 2 and 3 (coordinator/local_tier.h: write, copy, marker per node); a save
// that stays local ends there, and one that also goes to the shared root
// reads its boxes back from the rank's local file in step 3 (SaveRun::
// ReadFromLocalCopy), the staging buffer already given back.
// In drain mode (Options::persistent_deadline_seconds) steps 3-7 run on the
// drain thread (SaveRun::HandOff, SaveRun::Drain), reading the rank's local
// file under a hold on the local step (LocalTier::Hold), and retention runs
// there too, never on the I/O thread. A save whose local commit failed is not
// drained: it would read the staging buffer, held then for as long as the
// shared file system makes the drain last.
//
// A crash anywhere before step 6 leaves a directory without a marker, which
// is never listed and is removed by the next Open.
//
// Where each part lives: steps 1-2 and the local commit are phases of
// SaveRun (this file), each given the I/O thread's communicator explicitly;
// steps 3-6 are a SharedCommit (coordinator/shared_commit.h), made with the
// I/O thread's communicator, or in drain mode with the drain thread's
// (SaveRun::Drain); step 7 is Retention (coordinator/retention.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <span>

#include <fmt/format.h>
#include "base/log.h"

#include "base/checksum.h"
#include "base/fault.h"
#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/committed_step.h"
#include "coordinator/layouts.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "coordinator/rank_report.h"
#include "coordinator/shared_commit.h"
#include "io/layout.h"
#include "io/mapped_file.h"
#include "io/root_store.h"
#include "io/step_index.h"

namespace mhckpt::internal {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

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

// One save on one rank: the steps of the protocol above, in order.
class ManagerImpl::SaveRun : public std::enable_shared_from_this<ManagerImpl::SaveRun> {
 public:
  SaveRun(ManagerImpl& impl, SaveJob& job)
      : impl_(impl), job_(job), t_(job.timings), rank_(impl.comm_.rank()) {}

  // Steps 1-2 and the local commit on the I/O thread, with its communicator;
  // then the shared root's part there too, or handed to the drain thread.
  Status Run() {
    const Comm& comm = impl_.comm_;
    // Each phase is bounded in time (Options::collective_timeout_seconds).
    Watchdog::Guard phase(impl_.watchdog_, "plan", job_.step);
    fault::SetStep(job_.step);
    if (job_.local.ok()) job_.local = fault::Hit("plan");
    auto t0 = Clock::now();
    MHCKPT_RETURN_IF_ERROR(Plan(comm));
    if (impl_.options_.verify_replicas) MHCKPT_RETURN_IF_ERROR(CheckReplicas(comm));
    t_.plan = Since(t0);
    t_.persistent = job_.persistent;
    Status local_tier;
    if (impl_.local_) {
      impl_.watchdog_.Enter("local", job_.step);
      t0 = Clock::now();
      local_tier = SaveLocal(comm);
      t_.local = Since(t0);
      if (rank_ == 0) LogLocal(local_tier);
      // Committed locally: the shared root's write reads this rank's boxes
      // from its local file, and the staging buffer goes back now, so the
      // next Save need not wait for the shared root (SaveTimings::budget_wait).
      if (local_tier.ok() && job_.persistent) ReadFromLocalCopy();
    }
    if (!job_.persistent) return local_tier;
    if (impl_.DrainMode()) return HandOff(comm, local_tier);
    Status s = Persistent(comm, &impl_.watchdog_);
    job_.committed_shared = s.ok();
    // A save to both tiers reports the local tier's failure too (the step
    // may then be committed in the shared root only: Steps says; retention
    // follows that commit all the same).
    return s.ok() ? local_tier : s;
  }

  // Steps 3-6, the shared root's part (coordinator/shared_commit.h), with
  // `comm`: the I/O thread's, watched by the watchdog; or the drain's, not
  // watched (the deadline is the bound).
  Status Persistent(const Comm& comm, Watchdog* watchdog) {
    SharedRoot where{*impl_.engine_, impl_.root_, *impl_.store_,
                     impl_.options_, watchdog,    [this] { return impl_.IsAbandoned(job_.step); }};
    return SharedCommit(comm, std::move(where), job_, plan_, from_local_ ? &from_local_ : nullptr,
                        std::move(local_sums_))
        .Run();
  }

 private:
  // Drain mode, after the local commit (collective on the I/O thread): one
  // vote says whether the drain thread is stuck past its deadline on any
  // rank (then the late part is abandoned, and this save skips the shared
  // root), and whether every rank can read its boxes from its file of the
  // local step. If so, the shared root's part is handed to the drain thread,
  // holding the local step (LocalTier::Hold: no later save recycles or
  // removes it while the drain reads it); the staging buffer is already
  // back. If not (the local commit failed, or a file could not be mapped),
  // this save skips the shared root too: a drain from the staging buffer
  // would keep it for as long as the shared file system makes the drain
  // last, and the next Save would wait for it. Returns the save's status.
  Status HandOff(const Comm& comm, const Status& local_tier) {
    auto [stuck, late] = impl_.DrainState();
    const bool readable = static_cast<bool>(from_local_);
    std::vector<int64_t> v{stuck ? 1 : 0, late, late >= 0 ? rank_ : -1, readable ? 0 : 1,
                           readable ? -1 : rank_};
    comm.AllreduceMax(&v);
    if (v[0] != 0) {
      if (v[1] >= 0) {
        Status abandoned = impl_.Abandon(v[1], static_cast<int>(v[2]));
        if (!abandoned.ok()) impl_.RecordError(abandoned);
      }
      t_.persistent = false;
      if (rank_ == 0) {
        Logger()->warn(
            "mhckpt: step {}: not written to the shared root: its writes are stuck there",
            job_.step);
      }
      return local_tier;
    }
    if (v[3] != 0) {
      t_.persistent = false;
      if (!local_tier.ok()) return local_tier;  // agreed: every rank has it
      return IoError(fmt::format(
          "rank {}: step {}: its file of the local step cannot be read back; the step is "
          "committed in the local tier only",
          v[4], job_.step));
    }
    hold_ = impl_.local_->HoldStep(job_.step);
    job_.drain = [self = shared_from_this()] { return self->Drain(); };
    return local_tier;
  }

  // Drain mode, on the drain thread: the shared root's part with the drain's
  // communicator, not watched by the watchdog (the deadline is the bound).
  // The local step is held until the part ends.
  Status Drain() {
    const Comm& comm = impl_.drain_comm();
    fault::SetStep(job_.step);
    impl_.MarkDrainStarted(job_.step);
    // Rank 0 creates the step in the shared root here, not in the plan round
    // (PrepareStep): refusing a committed one, on every rank alike; or skips
    // a part that was abandoned while it was queued (rank 0 decides, so that
    // every rank skips it or none).
    Status s = rank_ == 0
                   ? Guarded("rank 0: create the step",
                             [&] {
                               if (impl_.IsAbandoned(job_.step)) {
                                 return IoError(fmt::format(
                                     "step {}: abandoned before its write started", job_.step));
                               }
                               return impl_.store_->CreateStep(job_.step);
                             })
                   : OkStatus();
    s = BroadcastStatus(s, 0, comm);
    if (s.ok()) s = Persistent(comm, nullptr);
    local_copy_.Close().IgnoreError();
    hold_.Release();
    return s;
  }

 private:
  // 1. Plan: reuse the previous one if every rank holds what it held then.
  Status Plan(const Comm& comm) {
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
      return InvalidArgument(fmt::format(
          "save of step {}: ranks disagree on its tier (SaveOptions::tier)", job_.step));
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

  // 1, without a plan to reuse: every rank's description to rank 0, which
  // plans; its outcome and plan to every rank. Descriptions travel once per
  // distinct layout: a digest from every rank, then the bytes from the first
  // rank of each layout (coordinator/layouts.h).
  Status GatherPlan(const Comm& comm) {
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
            PlanOnRoot(encoded, groups, *impl_.store_, impl_.local_.get(), job_.step,
                       job_.persistent, !impl_.DrainMode(), impl_.options_);
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

  // 1: what this rank tells rank 0. Never throws, and never more than
  // kMaxDescriptionBytes: an error of its own instead.
  std::string MyDescription() {
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

  // 2. Replica check: replicas must agree before anything is written.
  Status CheckReplicas(const Comm& comm) {
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

  // The local tier (coordinator/local_tier.h): write and copy, then rank 0
  // fills the marker from every rank's checksums and every node puts it.
  Status SaveLocal(const Comm& comm) {
    const auto staged = StagedByName(job_.snapshot);
    std::vector<BoxSum> sums;
    Status mine = impl_.local_->Write(
        comm, plan_,
        [&](size_t ai, size_t bi) {
          auto it = staged.find(plan_.arrays[ai].name);
          return FindStaged(job_.snapshot, it == staged.end() ? nullptr : it->second,
                            plan_.arrays[ai].boxes[bi].box);
        },
        &sums,
        [&](size_t ai, size_t bi) -> const StagedBox* {
          auto it = staged.find(plan_.arrays[ai].name);
          if (it == staged.end()) return nullptr;
          for (const StagedBox& b : it->second->boxes) {
            if (b.box == plan_.arrays[ai].boxes[bi].box) return &b;
          }
          return nullptr;
        });
    std::vector<std::string> reports = comm.GatherBytes(EncodeReport(mine, sums), 0);
    local_sums_ = std::move(sums);  // the shared root's commit reuses them
    io::Marker marker;
    std::string text;
    Status s;
    if (rank_ == 0) {
      s = Guarded("rank 0: local commit", [&] {
        marker = plan_;
        // A node's marker lists every chunk (format 2): its steps are read
        // back by the node's ranks and their partners, not at scale.
        if (marker.format_version >= 3) io::PlanChunks(&marker, marker.chunk_bytes, 2);
        marker.files = 0;  // nor subfiles: a reused plan keeps the last save's
        MHCKPT_RETURN_IF_ERROR(FillChecksums(reports, &marker));
        marker.created_unix_ms = NowUnixMs();
        if (marker.preemption) {
          marker.preemption->saved_after_ms =
              marker.created_unix_ms - marker.preemption->notice_unix_ms;
        }
        text = io::MarkerToJson(marker);
        return OkStatus();
      });
    }
    s = BroadcastStatus(s, 0, comm);
    if (s.ok()) {
      comm.BroadcastBytes(&text, 0);
      Status parsed;
      if (rank_ != 0) {
        Result<io::Marker> m = io::ParseMarker(text, "rank 0's local marker");
        if (m.ok()) {
          marker = std::move(m).value();
        } else {
          parsed = Internal(fmt::format("rank {}: {}", rank_, m.status().message()));
        }
      }
      s = AgreeAll(parsed, comm);
    }
    if (!s.ok()) {
      impl_.local_->Abandon(comm, job_.step);
      return s;
    }
    return impl_.local_->Commit(comm, marker, text);
  }

  // After a local commit: map this rank's file of the step, and give the
  // staging buffer back. If the file cannot be mapped, the snapshot is kept
  // (for a write on the I/O thread; a drain then skips the shared root).
  void ReadFromLocalCopy() {
    Result<io::MappedFile> f =
        io::MappedFile::OpenForReading(impl_.local_->FilePath(job_.step, rank_));
    if (!f.ok()) return;
    local_copy_ = std::move(f).value();
    const WriterFiles files(plan_);
    from_local_ = [this, offsets = files.offset](size_t ai, size_t bi) {
      const io::MarkerArray& a = plan_.arrays[ai];
      const uint64_t at = offsets[ai][bi], n = BoxBytes(a.boxes[bi].box, a.dtype);
      if (at + n > local_copy_.size()) return std::span<const std::byte>();
      return std::span<const std::byte>(local_copy_.data() + at, n);
    };
    job_.snapshot.buffer = StagingBuffer();
  }

  void LogLocal(const Status& s) const {
    if (!s.ok()) {
      Logger()->error("mhckpt: step {} failed in the local tier: {}", job_.step, s.ToString());
    } else {
      Logger()->info("mhckpt: step {} committed in the local tier in {:.3f} s{}", job_.step,
                     t_.local, job_.persistent ? "" : " (local only)");
    }
  }

  void RemoveStepDir() const { impl_.store_->RemoveStep(job_.step).IgnoreError(); }

  ManagerImpl& impl_;
  SaveJob& job_;
  SaveTimings& t_;
  const int rank_;
  io::Marker plan_;
  LocalTier::Hold hold_;            // drain mode: the local step, while the drain reads it
  io::MappedFile local_copy_;       // after a local commit: this rank's file
  StagedBoxFn from_local_;          // its boxes in local_copy_
  std::vector<BoxSum> local_sums_;  // the checksums the local commit took
};

Status ManagerImpl::RunSave(SaveJob& job) { return std::make_shared<SaveRun>(*this, job)->Run(); }

}  // namespace mhckpt::internal
