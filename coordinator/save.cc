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
//   7. Retention (ManagerImpl::RunRetention). After the outcome is recorded,
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
#include "coordinator/retention.h"
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

// The staged bytes of planned box `box` of `a`: a staged box equal to it, or
// (replica-parallel saving, plan.h) a staged box of which `box` is a run of
// whole rows. Empty if this rank holds no such box.
std::span<const std::byte> FindStaged(const Snapshot& snapshot, const StagedArray* a,
                                      const Box& box) {
  if (a == nullptr) return {};
  for (const StagedBox& sb : a->boxes) {
    if (sb.box == box) return {snapshot.data(sb), sb.size};
  }
  for (const StagedBox& sb : a->boxes) {
    if (auto run = RowRunBytes(sb.box, box, sb.size)) {
      return {snapshot.data(sb) + run->first, run->second};
    }
  }
  return {};
}

// A rank's description may not exceed this: rank 0 gathers every rank's
// (MPI counts are ints), and kMaxArraysPerSave / kMaxShardsPerRank keep a
// valid one far below it.
constexpr size_t kMaxDescriptionBytes = size_t{1} << 30;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Format 3, each rank: the index records of the boxes it wrote (`sums`, in
// plan order), put at their places in the step's index file (records next to
// each other in one write) and made durable; rank 0 also writes the header.
// `sums` then hold each record's check word, for rank 0.
Status WriteIndexRecords(const std::string& path, const io::Marker& plan, int rank,
                         const io::StepWriter& writer, std::vector<BoxSum>* sums) {
  if (sums->empty() && rank != 0) return OkStatus();
  MHCKPT_ASSIGN_OR_RETURN(io::IndexLayout layout, io::IndexLayout::Of(plan, "the plan"));
  std::vector<std::pair<uint64_t, std::string>> ranges;
  if (rank == 0) ranges.emplace_back(0, io::IndexHeader(plan.step));
  for (BoxSum& b : *sums) {
    const uint64_t at = layout.offset(b.array, b.box);
    if (ranges.empty() || ranges.back().first + ranges.back().second.size() != at) {
      ranges.emplace_back(at, std::string());
    }
    std::optional<io::BoxPlace> place;
    if (plan.files > 0) {
      place = writer.Place(b.array, b.box);
      if (!place) {
        const io::MarkerArray& a = plan.arrays[b.array];
        return Internal(fmt::format("array '{}' box {}: rank {} wrote it, but not into a subfile",
                                    a.name, BoxToString(a.boxes[b.box].box), rank));
      }
    }
    b.sum = io::AppendIndexRecord(b.array, b.box, b.sum, b.chunks, &ranges.back().second, place);
    b.chunks = {};
  }
  return io::PutIndexRanges(path, ranges);
}

std::map<std::string_view, const StagedArray*> StagedByName(const Snapshot& snapshot) {
  std::map<std::string_view, const StagedArray*> staged;
  for (const StagedArray& a : snapshot.arrays) staged[a.name] = &a;
  return staged;
}

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

// What this rank writes of one save, and what it learns while writing.
struct Writes {
  const io::Marker& plan;
  const Snapshot& snapshot;
  int rank;
  bool collective;  // Transfer::kCollective: the same number of calls per array everywhere
  uint64_t written = 0;
  std::vector<BoxSum> sums;
  // After a local commit: the rank's boxes from its file of the local step
  // (the same plan, so the same boxes), instead of the snapshot.
  const StagedBoxFn* from_local = nullptr;
  // With from_local: `sums` already holds this rank's checksums (the local
  // commit took them for the same plan), so nothing is hashed twice.
  bool have_sums = false;
};

// Step 3, one array: the boxes of plan array `ai` that this rank writes.
// Keeps making every collective call after a local error, which it returns.
Status WriteArray(io::StepWriter& writer, size_t ai, const StagedArray* staged, Writes& w,
                  Status local) {
  const io::MarkerArray& a = w.plan.arrays[ai];
  std::map<int, int> writes_per_rank;
  for (const io::MarkerBox& b : a.boxes) ++writes_per_rank[b.writer];
  int calls = 0, max_calls = 0;
  for (auto [r, n] : writes_per_rank) max_calls = std::max(max_calls, n);
  for (size_t bi = 0; bi < a.boxes.size(); ++bi) {
    const io::MarkerBox& b = a.boxes[bi];
    if (b.writer != w.rank) continue;
    ++calls;
    std::span<const std::byte> box =
        w.from_local != nullptr ? (*w.from_local)(ai, bi) : FindStaged(w.snapshot, staged, b.box);
    if (!local.ok() || box.data() == nullptr) {
      if (local.ok()) {
        local = Internal(fmt::format("array '{}' box {}: planned for rank {}, not staged there",
                                     a.name, BoxToString(b.box), w.rank));
      }
      if (w.collective) writer.WriteNothing(ai).IgnoreError();
      continue;
    }
    if (!w.have_sums) w.sums.push_back(BoxChecksums(a, ai, bi, box));
    local = writer.Write(ai, b.box, box.data());
    w.written += box.size();
    if (local.ok()) local = fault::Hit("mid_write", w.written);
  }
  for (; w.collective && calls < max_calls; ++calls) {
    Status s = writer.WriteNothing(ai);
    if (local.ok()) local = s;
  }
  return local;
}

// Step 3: this rank's boxes of every array, in plan order.
Status WriteBoxes(io::StepWriter& writer, Writes& w) {
  const auto staged = StagedByName(w.snapshot);
  Status local;
  for (size_t ai = 0; ai < w.plan.arrays.size(); ++ai) {
    auto it = staged.find(w.plan.arrays[ai].name);
    local = WriteArray(writer, ai, it == staged.end() ? nullptr : it->second, w, local);
  }
  return local;
}

}  // namespace

// One save on one rank: the steps of the protocol above, in order.
class ManagerImpl::SaveRun : public std::enable_shared_from_this<ManagerImpl::SaveRun> {
 public:
  SaveRun(ManagerImpl& impl, SaveJob& job)
      : impl_(impl), comm_(&impl.comm_), job_(job), t_(job.timings), rank_(impl.comm_.rank()) {}

  Status Run() {
    // Each phase is bounded in time (Options::collective_timeout_seconds).
    Watchdog::Guard phase(impl_.watchdog_, "plan", job_.step);
    fault::SetStep(job_.step);
    if (job_.local.ok()) job_.local = fault::Hit("plan");
    auto t0 = Clock::now();
    MHCKPT_RETURN_IF_ERROR(Plan());
    if (impl_.options_.verify_replicas) MHCKPT_RETURN_IF_ERROR(CheckReplicas());
    t_.plan = Since(t0);
    t_.persistent = job_.persistent;
    Status local_tier;
    if (impl_.local_) {
      impl_.watchdog_.Enter("local", job_.step);
      t0 = Clock::now();
      local_tier = SaveLocal();
      t_.local = Since(t0);
      if (rank_ == 0) LogLocal(local_tier);
      // Committed locally: the shared root's write reads this rank's boxes
      // from its local file, and the staging buffer goes back now, so the
      // next Save need not wait for the shared root (SaveTimings::budget_wait).
      if (local_tier.ok() && job_.persistent) ReadFromLocalCopy();
    }
    if (!job_.persistent) return local_tier;
    if (impl_.DrainMode()) return HandOff(local_tier);
    Status s = Persistent();
    job_.committed_shared = s.ok();
    // A save to both tiers reports the local tier's failure too (the step
    // may then be committed in the shared root only: Steps says; retention
    // follows that commit all the same).
    return s.ok() ? local_tier : s;
  }

  // Steps 3-6, the shared root's part: on the I/O thread, or on the drain
  // thread (HandOff).
  Status Persistent() {
    Write();
    Flush();
    if (!local_.ok()) {
      local_ = Status(local_.code(), fmt::format("rank {}: {}", rank_, local_.message()));
    }
    Enter("commit");
    auto t0 = Clock::now();
    std::vector<std::string> reports = Agree();
    // Guarded: rank 0 must reach the broadcast below whatever happens here.
    Status s = rank_ == 0 ? Guarded("rank 0: commit", [&] { return Commit(reports); }) : OkStatus();
    if (!s.ok() && s.code() == StatusCode::kInternal && rank_ == 0) RemoveStepDir();
    s = BroadcastStatus(s, 0, *comm_);
    t_.commit = Since(t0);
    if (rank_ == 0) Log(s);
    return s;
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
  Status HandOff(const Status& local_tier) {
    auto [stuck, late] = impl_.DrainState();
    const bool readable = static_cast<bool>(from_local_);
    std::vector<int64_t> v{stuck ? 1 : 0, late, late >= 0 ? rank_ : -1, readable ? 0 : 1,
                           readable ? -1 : rank_};
    comm_->AllreduceMax(&v);
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
    comm_ = &impl_.drain_comm();
    watched_ = false;
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
    s = BroadcastStatus(s, 0, *comm_);
    if (s.ok()) s = Persistent();
    local_copy_.Close().IgnoreError();
    hold_.Release();
    return s;
  }

  void Enter(const char* phase) {
    if (watched_) impl_.watchdog_.Enter(phase, job_.step);
  }

 private:
  // 1. Plan: reuse the previous one if every rank holds what it held then.
  Status Plan() {
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
    comm_->AllreduceMax(&votes);
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
      MHCKPT_RETURN_IF_ERROR(GatherPlan());
      impl_.last_plan_ = plan_;
      impl_.last_description_hash_ = hash;
    }
    plan_.user_metadata = job_.metadata;  // rank 0's is the one written
    return OkStatus();
  }

  // 1, without a plan to reuse: every rank's description to rank 0, which
  // plans; its outcome and plan to every rank. Descriptions travel once per
  // distinct layout: a digest from every rank, then the bytes from the first
  // rank of each layout (coordinator/layouts.h).
  Status GatherPlan() {
    const std::string mine = MyDescription();
    std::vector<std::string> digests = comm_->GatherBytes(LayoutDigest(mine), 0);
    LayoutGroups groups;
    std::vector<int> send;
    if (rank_ == 0) {
      groups = GroupLayouts(digests);
      send.assign(digests.size(), 0);
      for (int r : groups.first_rank) send[static_cast<size_t>(r)] = 1;
    }
    const bool sender = comm_->ScatterInt(send, 0) != 0;
    std::vector<std::string> encoded = comm_->GatherBytes(sender ? mine : std::string(), 0);
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
    MHCKPT_RETURN_IF_ERROR(BroadcastStatus(s, 0, *comm_));
    comm_->BroadcastBytes(&plan_json, 0);
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
    return AgreeAll(parsed, *comm_);
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
  Status CheckReplicas() {
    std::vector<std::string> held =
        comm_->GatherBytes(EncodeReport(OkStatus(), HoldingChecksums(plan_, job_.snapshot)), 0);
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
    return BroadcastStatus(s, 0, *comm_);
  }

  // The local tier (coordinator/local_tier.h): write and copy, then rank 0
  // fills the marker from every rank's checksums and every node puts it.
  Status SaveLocal() {
    const auto staged = StagedByName(job_.snapshot);
    std::vector<BoxSum> sums;
    Status mine = impl_.local_->Write(
        *comm_, plan_,
        [&](size_t ai, size_t bi) {
          auto it = staged.find(plan_.arrays[ai].name);
          return FindStaged(job_.snapshot, it == staged.end() ? nullptr : it->second,
                            plan_.arrays[ai].boxes[bi].box);
        },
        &sums);
    std::vector<std::string> reports = comm_->GatherBytes(EncodeReport(mine, sums), 0);
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
        text = io::MarkerToJson(marker);
        return OkStatus();
      });
    }
    s = BroadcastStatus(s, 0, *comm_);
    if (s.ok()) {
      comm_->BroadcastBytes(&text, 0);
      Status parsed;
      if (rank_ != 0) {
        Result<io::Marker> m = io::ParseMarker(text, "rank 0's local marker");
        if (m.ok()) {
          marker = std::move(m).value();
        } else {
          parsed = Internal(fmt::format("rank {}: {}", rank_, m.status().message()));
        }
      }
      s = AgreeAll(parsed, *comm_);
    }
    if (!s.ok()) {
      impl_.local_->Abandon(*comm_, job_.step);
      return s;
    }
    return impl_.local_->Commit(*comm_, marker, text);
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

  // 3. Write: create the step's arrays, reserve their space, write this
  // rank's boxes; then give the staging buffer back.
  void Write() {
    Enter("write");
    auto t0 = Clock::now();
    t_.written_bytes = 0;
    Result<std::unique_ptr<io::StepWriter>> writer =
        impl_.engine_->Create(impl_.root_, job_.step, *comm_);
    // Why an agreement: creating the arrays is collective; a rank that could
    // not create the step must not leave the others alone in it.
    if (!AgreeAll(writer.status(), *comm_).ok()) {
      local_ = writer.status();  // the failing ranks report it in step 5
      return;
    }
    writer_ = std::move(writer).value();
    std::vector<io::ArraySpec> specs;
    specs.reserve(plan_.arrays.size());
    for (const io::MarkerArray& a : plan_.arrays) {
      io::ArraySpec& spec = specs.emplace_back(StoredSpec(a));
      const bool one = !a.boxes.empty() &&
                       std::all_of(a.boxes.begin(), a.boxes.end(), [&](const io::MarkerBox& b) {
                         return b.writer == a.boxes.front().writer;
                       });
      spec.writer = one ? a.boxes.front().writer : -1;  // a layout hint
      if (impl_.options_.files.ranks_per_file != 0) {
        spec.boxes.reserve(a.boxes.size());
        for (const io::MarkerBox& b : a.boxes) spec.boxes.push_back({b.box, b.writer});
      }
    }
    local_ = writer_->CreateArrays(specs);
    // With subfiles the index holds each box's place: every rank sizes the
    // index's records so.
    plan_.files = writer_->Files();
    // Where each array lies in the data file, for readers that bypass the
    // engine's per-array opens (docs/FORMAT.md); rank 0 writes the marker.
    for (size_t i = 0; local_.ok() && rank_ == 0 && i < plan_.arrays.size(); ++i) {
      plan_.arrays[i].offset = writer_->FileOffset(i);
    }
    if (ReserveEverywhere()) {
      Writes w{plan_,
               job_.snapshot,
               rank_,
               impl_.options_.transfer == Transfer::kCollective,
               0,
               {},
               from_local_ ? &from_local_ : nullptr,
               false};
      if (from_local_) {
        w.sums = std::move(local_sums_);
        w.have_sums = true;
      }
      local_ = WriteBoxes(*writer_, w);
      Status finished = writer_->FinishWrites();  // before the buffer goes back
      if (local_.ok()) local_ = finished;
      t_.written_bytes = w.written;
      sums_ = std::move(w.sums);
    }
    t_.write = Since(t0);
    // Nothing reads the staged bytes after the write phase (the replica check
    // came before it, the checksums were taken while writing, and the engine
    // read its last byte in FinishWrites): give the buffer back now, so a save waiting for
    // staging memory (SaveTimings::budget_wait) need not wait for the flush
    // and the commit too (docs/PERFORMANCE.md).
    job_.snapshot.buffer = StagingBuffer();
  }

  // 3, before writing: rank 0 reserves the step's space on disk and all
  // agree, so a full file system fails here, on every rank alike, and not
  // inside a collective flush where one rank's error can strand the others.
  // A rank whose array creation failed stops every rank here too.
  bool ReserveEverywhere() {
    Status reserved = local_;
    if ((rank_ == 0 || writer_->Files() > 0) && local_.ok()) {
      reserved = writer_->Reserve();
      local_ = reserved;  // only rank 0 reports it
    }
    return AgreeAll(reserved, *comm_).ok();
  }

  // 4. Flush: make the step durable, and close it.
  void Flush() {
    if (writer_ == nullptr) return;
    auto t0 = Clock::now();
    Enter("flush");
    Status flushed = writer_->Flush();
    if (local_.ok()) local_ = flushed;
    // Format 3: this rank's index records, durable before it reports.
    if (local_.ok() && plan_.format_version >= 3) {
      local_ =
          WriteIndexRecords(io::IndexPath(impl_.root_, job_.step), plan_, rank_, *writer_, &sums_);
    }
    if (local_.ok()) local_ = fault::Hit("after_flush");
    t_.flush = Since(t0);
  }

  // 5. Agree: rank 0 learns every rank's outcome and the checksums of the
  // boxes each wrote (the outcome goes to everyone after step 7).
  std::vector<std::string> Agree() { return comm_->GatherBytes(EncodeReport(local_, sums_), 0); }

  // 6. Commit (rank 0): the marker if every rank succeeded, else clean up.
  Status Commit(const std::vector<std::string>& reports) {
    Status s;
    if (plan_.format_version >= 3) {
      Result<io::IndexLayout> layout = io::IndexLayout::Of(plan_, "the plan");
      s = layout.ok() ? FillIndex(reports, *layout, &plan_) : layout.status();
    } else {
      s = FillChecksums(reports, &plan_);
    }
    if (s.ok() && impl_.IsAbandoned(job_.step)) {
      s = IoError(
          fmt::format("step {}: the shared root's write was abandoned; no marker", job_.step));
    }
    // The names of the step's files durable before the marker's can be: with
    // only the marker's rename and the fsync after it, a file system that does
    // not journal names in order may keep the marker and lose data.h5's name
    // (found by tests/crashstate, docs/RELIABILITY.md "Crash states").
    if (s.ok()) s = impl_.store_->SyncStep(job_.step);
    if (s.ok()) s = fault::Hit("before_marker");
    // Again, last: in drain mode the part may have been abandoned while the
    // step synced (a stuck file system); an abandoned step gets no marker.
    if (s.ok() && impl_.IsAbandoned(job_.step)) {
      s = IoError(
          fmt::format("step {}: the shared root's write was abandoned; no marker", job_.step));
    }
    if (s.ok()) {
      plan_.created_unix_ms = NowUnixMs();
      const std::string text = io::MarkerToJson(plan_);
      // A marker larger than readers accept would commit a step that no
      // restore can open.
      if (text.size() > io::kMaxMarkerBytes) {
        RemoveStepDir();
        return InvalidArgument(fmt::format(
            "rank 0: the commit marker of step {} would be {} bytes, more than the {} that "
            "readers accept (too many arrays or boxes)",
            job_.step, text.size(), io::kMaxMarkerBytes));
      }
      s = impl_.store_->PutMarker(plan_, text);
      if (!s.ok()) s = Status(s.code(), fmt::format("rank 0: commit marker: {}", s.message()));
    }
    if (!s.ok()) RemoveStepDir();
    return s;
  }

  void Log(const Status& s) const {
    if (!s.ok()) {
      Logger()->error("mhckpt: step {} failed: {}", job_.step, s.ToString());
      return;
    }
    Logger()->info(
        "mhckpt: step {} committed: {:.1f} MiB in {:.3f} s (budget wait {:.3f}, snapshot {:.3f}, "
        "plan {:.3f}{}, write {:.3f}, flush {:.3f}, commit {:.3f})",
        job_.step, static_cast<double>(plan_.total_bytes) / (1 << 20),
        t_.budget_wait + t_.snapshot + t_.plan + t_.write + t_.flush + t_.commit, t_.budget_wait,
        t_.snapshot, t_.plan, t_.plan_cached ? " cached" : "", t_.write, t_.flush, t_.commit);
  }

  void RemoveStepDir() const { impl_.store_->RemoveStep(job_.step).IgnoreError(); }

  ManagerImpl& impl_;
  const Comm* comm_;  // the I/O thread's, or the drain's
  SaveJob& job_;
  SaveTimings& t_;
  const int rank_;
  io::Marker plan_;
  std::unique_ptr<io::StepWriter> writer_;  // from step 3 on, if the engine created the step
  Status local_;                            // this rank's first error from step 3 on
  std::vector<BoxSum> sums_;                // of the boxes this rank wrote
  LocalTier::Hold hold_;                    // drain mode: the local step, while the drain reads it
  io::MappedFile local_copy_;               // after a local commit: this rank's file
  StagedBoxFn from_local_;                  // its boxes in local_copy_
  std::vector<BoxSum> local_sums_;          // the checksums the local commit took
  bool watched_ = true;                     // by the watchdog (not on the drain thread)
};

Status ManagerImpl::RunSave(SaveJob& job) { return std::make_shared<SaveRun>(*this, job)->Run(); }

// 7. Retention (rank 0, I/O thread), after RecordSave: WaitUntilFinished
// waits for this part, which only retires old steps (marker removed, then
// the directory renamed: milliseconds); the deleter thread frees their files
// afterwards, so the next job does not wait for that either.
// CheckpointManager::CommittedSteps waits for this part too.
void ManagerImpl::RunRetention(int64_t step) {
  auto t0 = Clock::now();
  // Guarded: RecordRetention must run whatever happens, or waiters hang.
  Status gc = Guarded("rank 0: retention", [&] {
    MHCKPT_ASSIGN_OR_RETURN(std::vector<int64_t> committed, store_->CommittedSteps());
    for (int64_t old : StepsToDelete(committed, options_.max_to_keep, options_.keep_period)) {
      MHCKPT_ASSIGN_OR_RETURN(std::string retired, store_->RetireStep(old));
      if (!retired.empty()) RemoveInBackground(std::move(retired));
    }
    return OkStatus();
  });
  if (!gc.ok()) Logger()->warn("mhckpt: retention after step {}: {}", step, gc.ToString());
  RecordRetention(Since(t0));
}

void ManagerImpl::RemoveInBackground(std::string dir) {
  if (!deleter_) deleter_ = std::make_unique<IoThread>();
  deleter_->Submit([store = store_.get(), dir = std::move(dir)] {
    Status s = store->RemoveRetired(dir);
    // Left behind, it is removed when the root is next opened.
    if (!s.ok()) Logger()->warn("mhckpt: removing retired '{}': {}", dir, s.ToString());
  });
}

}  // namespace mhckpt::internal
