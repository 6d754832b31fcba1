// ManagerImpl (coordinator/manager_impl.h): the caller-thread side of the
// manager — submitting saves to the I/O thread, recording their outcomes,
// WaitUntilFinished, the drain's bookkeeping (coordinator/drain_queue.h) and
// retention's (coordinator/retention.h).
#include "coordinator/manager_impl.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include <fmt/format.h>

#include "base/guard.h"
#include "base/log.h"
#include "coordinator/agree.h"
#include "coordinator/shared_commit.h"
#include "io/layout.h"
#include "worker/copy.h"

namespace mhckpt::internal {

namespace {

io::StorageOptions StorageFor(const Options& options) {
  io::StorageOptions s;
  s.transfer = options.transfer == Transfer::kCollective ? io::Transfer::kCollective
                                                         : io::Transfer::kIndependent;
  s.pwrite = options.data_path != DataPath::kHdf5;
  s.direct = options.data_path == DataPath::kDirect;
  if (options.writer_threads > 0) s.writer_threads = options.writer_threads;
  s.ranks_per_file = options.files.ranks_per_file;
  return s;
}

}  // namespace

ManagerImpl::ManagerImpl(Comm comm, std::string root, const Options& options, bool async)
    : comm_(std::move(comm)),
      root_(std::move(root)),
      options_(options),
      async_(async),
      pool_(options.staging_budget_bytes),
      watchdog_(comm_, options.collective_timeout_seconds),
      engine_(io::MakeEngine(StorageFor(options))),
      device_broadcasts_(options.collective_timeout_seconds, &watchdog_),
      drains_(options.persistent_deadline_seconds) {
  if (CudaAvailable()) {
    // Pinned once per buffer (at its first use, or a later one if that
    // failed); buffers are reused, so pinning is not per save.
    pool_.SetHooks(PinHostMemory, UnpinHostMemory);
  }
  pool_.SetCarryOver(options.carry_staging_over);
  if (async_) thread_ = std::make_unique<IoThread>();
}

Status ManagerImpl::RunOnIoThread(const std::function<Status()>& fn) {
  // An exception of `fn` stops here, as Internal naming the rank; the
  // protocols guard their rank-local sections themselves, so that a rank
  // does not leave a collective round on an exception.
  const std::string where = fmt::format("rank {}", comm_.rank());
  if (!async_) return Guarded(where, fn);
  std::promise<Status> done;
  thread_->Submit([&] { done.set_value(Guarded(where, fn)); });
  return done.get_future().get();
}

void ManagerImpl::RecordSave(const Status& s, const SaveTimings& t, bool retention_follows) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = s;
  last_timings_ = t;
  --saves_in_flight_;
  if (retention_follows) ++retentions_pending_;
  saves_cv_.notify_all();
}

void ManagerImpl::RunRetention(int64_t step) { RecordRetention(retention_->Run(step)); }

void ManagerImpl::RecordRetention(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  last_timings_.gc = seconds;
  --retentions_pending_;
  saves_cv_.notify_all();
}

void ManagerImpl::Adopt(std::unique_ptr<io::RootStore> store,
                        std::unique_ptr<io::RootOwnership> root_lock, Comm caller_comm) {
  store_ = std::move(store);
  root_lock_ = std::move(root_lock);
  if (comm_.rank() == 0) {
    retention_ = std::make_unique<Retention>(
        store_.get(), options_.max_to_keep, options_.keep_period, options_.keep_best,
        static_cast<int64_t>(options_.keep_time_interval_seconds * 1000));
  }
  caller_comm_ = std::move(caller_comm);
}

void ManagerImpl::SubmitSave(std::shared_ptr<SaveJob> job, std::string where) {
  // From here on no caller buffer is read again. The job always runs, even
  // with a local error: the other ranks are waiting for this rank's plan.
  // Retention (rank 0) runs after the outcome is recorded, off the path to
  // the commit that WaitUntilFinished waits for; later jobs run after it.
  auto run = [this, job = std::move(job), where = std::move(where)] {
    // A lazy save's copy ends before this rank enters the plan round.
    if (job->copier.joinable()) job->copier.join();
    Status s = Guarded(where, [&] { return RunSave(*job); });
    // Release staging memory before reporting. A drain reads the rank's
    // local file, never the snapshot (SaveRun::HandOff), so it goes back
    // now whatever the shared root does.
    const bool drains = static_cast<bool>(job->drain);
    job->snapshot = Snapshot();
    // A drain is counted before the save is recorded (WaitUntilFinished then
    // sees it), and starts after (it writes the job's timings).
    if (drains) BeginDrain(job->step);
    // Retention runs on one thread: in drain mode the drain thread, the only
    // one that commits to the shared root then (a save there that stays
    // local changes nothing retention looks at).
    const bool retain =
        retention_ && retention_->FollowsSave(s.ok(), job->committed_shared, DrainMode());
    RecordSave(s, job->timings, retain);
    if (retain) RunRetention(job->step);
    if (drains) {
      // The shared root's part goes on beside the I/O thread (DrainMode).
      drain_->Submit([this, job, where] {
        Status d = Guarded(where, [&] { return job->drain(); });
        job->drain = nullptr;  // frees the save's state (its hold on the local step)
        const bool retain_shared = retention_ && retention_->FollowsDrain(d.ok());
        EndDrain(job->step, d, job->timings, retain_shared);
        if (retain_shared) RunRetention(job->step);
      });
    }
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++saves_in_flight_;
  }
  if (async_)
    thread_->Submit(std::move(run));
  else
    run();
}

Status ManagerImpl::WaitUntilFinished() {
  Status s;
  int64_t late = -1;
  {
    // Every save recorded and (without a drain) its retention done (rank 0):
    // a step committed before the call is listed, a step retention deletes
    // is not.
    std::unique_lock<std::mutex> lock(mu_);
    saves_cv_.wait(lock, [this] {
      return saves_in_flight_ == 0 && (drain_ != nullptr || retentions_pending_ == 0);
    });
    // Drain mode: every shared root's part handed off before the call (all
    // are: each save is recorded after its hand-off), and the retention
    // after it. Each part has persistent_deadline_seconds from its own
    // start; one still queued waits for the one before it. When the drain
    // thread's current work is past its deadline, the first part not ended
    // nor abandoned is late: it (and every part after it) is abandoned below.
    while (drain_) {
      const bool drains_left = drains_.FirstUnabandoned() >= 0;
      if (!drains_left && retentions_pending_ == 0) break;
      const auto due = drains_.Due(retentions_pending_ > 0);
      if (due && std::chrono::steady_clock::now() >= *due) {
        late = drains_.FirstUnabandoned();  // -1: only a late retention, not waited for
        break;
      }
      if (due) {
        saves_cv_.wait_until(lock, *due);
      } else {
        saves_cv_.wait(lock);
      }
    }
    s = first_error_;
    first_error_ = OkStatus();
  }
  if (drain_) {
    // Why a vote: a shared root's write late on one rank is late for all.
    std::vector<int64_t> v{late, late >= 0 ? comm_.rank() : -1};
    caller_comm_.AllreduceMax(&v);
    if (v[0] >= 0) {
      Status abandoned = Abandon(v[0], static_cast<int>(v[1]));
      if (s.ok()) s = abandoned;
    }
    // Why an agreement, not a barrier: the shared root's outcome reaches each
    // rank's first error at its own moment; the lowest failing rank's is the
    // one every rank returns.
    return AgreeAll(s, caller_comm_);
  }
  // Why a barrier: rank 0's retention ends after the others' saves are
  // recorded; listings after this call must agree on every rank.
  caller_comm_.Barrier();
  return s;
}

void ManagerImpl::StartDrain(Comm comm) {
  drain_comm_ = std::move(comm);
  drain_ = std::make_unique<IoThread>();
}

void ManagerImpl::BeginDrain(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  drains_.HandOff(step);
}

void ManagerImpl::MarkDrainStarted(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  drains_.Started(step, std::chrono::steady_clock::now());
  saves_cv_.notify_all();  // WaitUntilFinished: a new deadline
}

void ManagerImpl::EndDrain(int64_t step, const Status& s, const SaveTimings& t,
                           bool retention_follows) {
  std::lock_guard<std::mutex> lock(mu_);
  if (retention_follows) ++retentions_pending_;
  const bool abandoned = drains_.Ended(step, retention_follows, std::chrono::steady_clock::now());
  // LastSaveTimings: the shared root's part of the latest drained save.
  last_timings_.write = t.write;
  last_timings_.flush = t.flush;
  last_timings_.commit = t.commit;
  last_timings_.written_bytes = t.written_bytes;
  if (abandoned) {
    Logger()->warn("mhckpt: step {}: the shared root's write ended after it was abandoned: {}",
                   step, s.ok() ? "OK" : s.ToString());
  } else if (!s.ok() && first_error_.ok()) {
    first_error_ = s;
  }
  saves_cv_.notify_all();
}

std::pair<bool, int64_t> ManagerImpl::DrainState() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!drains_.Late(retentions_pending_ > 0, std::chrono::steady_clock::now())) return {false, -1};
  return {true, drains_.FirstUnabandoned()};
}

Status ManagerImpl::Abandon(int64_t step, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  Status s = drains_.Abandon(step, rank);
  if (!s.ok() && comm_.rank() == 0) Logger()->error("mhckpt: {}", s.ToString());
  return s;
}

void ManagerImpl::RecordError(const Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = s;
}

bool ManagerImpl::IsAbandoned(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return drains_.IsAbandoned(step);
}

void ManagerImpl::WaitForRetention() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (retentions_pending_ == 0) return;
    // Drain mode: a retention stuck on the shared root past the deadline is
    // not waited for (the listing is then the store's, as it is).
    const auto due = drain_ ? drains_.Due(true) : std::nullopt;
    const bool part_running = drains_.PartRunning();
    if (due && !part_running && std::chrono::steady_clock::now() >= *due) return;
    if (due && !part_running) {
      saves_cv_.wait_until(lock, *due);
    } else {
      saves_cv_.wait(lock);
    }
  }
}

Status ManagerImpl::Restore(int64_t step, std::span<const ArrayToRestore> arrays,
                            const RestoreOptions& options) {
  // Here, on the caller's thread: cudaStreamPerThread names its stream only
  // here, not on the I/O thread that copies (worker/copy.h).
  StreamProxies callers;
  std::vector<ArrayToRestore> resolved;
  const std::span<const ArrayToRestore> wanted = callers.Resolve(arrays, &resolved);
  // FIFO on the I/O thread: pending saves finish first.
  Status s = RunOnIoThread([&] {
    Watchdog::Guard phase(watchdog_, "restore", step);
    return RunRestore(step, wanted, options);
  });
  callers.Finish();
  return s;
}

Status ManagerImpl::Verify(int64_t step, const VerifyOptions& options, VerifyReport* report) {
  return RunOnIoThread([&] {
    Watchdog::Guard phase(watchdog_, "verify", step);
    return RunVerify(step, options, report);
  });
}

Status ManagerImpl::Delete(int64_t step) {
  // Saves in flight first: a step being committed, drained or retired is
  // settled before it is looked for. Their error is Delete's, and nothing
  // is deleted.
  MHCKPT_RETURN_IF_ERROR(WaitUntilFinished());
  return RunOnIoThread([&] {
    Watchdog::Guard phase(watchdog_, "delete", step);
    return RunDelete(step);
  });
}

Result<Deletions> ManagerImpl::ReadLocalDeletions() {
  Result<std::string> text = store_->GetLocalDeletions();
  if (text.status().code() == StatusCode::kNotFound) return Deletions();
  MHCKPT_RETURN_IF_ERROR(text.status());
  return ParseLocalDeletions(*text, fmt::format("{}/{}", root(), io::kLocalDeletionsFileName));
}

// 1. Which tiers hold the step: rank 0 lists the shared root (broadcast);
//    the local tier's view is agreed. Neither: NotFound. A local step held
//    by a reader: FailedPrecondition, and nothing is deleted.
// 2. The shared root (rank 0, Retention::Retire: its marker first, so the
//    step is no longer committed; the files freed in the background). Agreed.
// 3. With a local tier: the step and the time recorded as deleted in the
//    shared root (rank 0), agreed. A node outside the job (or a crash before
//    4) leaves local files of the step, found in or out of this job's view;
//    a later job's recovery removes them instead of restoring them.
// 4. The local tier (LocalTier::Delete), agreed.
Status ManagerImpl::RunDelete(int64_t step) {
  std::vector<int64_t> shared{0};
  Status listed;
  if (comm_.rank() == 0) {
    Result<std::vector<int64_t>> steps = store_->CommittedSteps();
    listed = steps.status();
    if (steps.ok()) shared[0] = std::binary_search(steps->begin(), steps->end(), step) ? 1 : 0;
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(listed, comm_));
  comm_.BroadcastValues(&shared, 0);
  const bool local = local_ && local_->Find(step) != nullptr;
  if (shared[0] == 0 && !local) {
    return NotFound(fmt::format("step {} is not committed in '{}'{}", step, root(),
                                local_ ? " nor in the local tier" : ""));
  }
  if (local) MHCKPT_RETURN_IF_ERROR(local_->CheckDeletable(comm_, step));
  if (shared[0] != 0) {
    Status s = comm_.rank() == 0 ? retention_->Retire(step) : OkStatus();
    MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm_));
  }
  if (!local_) return OkStatus();
  Status recorded;
  if (comm_.rank() == 0) {
    recorded = Guarded("rank 0: the record of deleted steps", [&]() -> Status {
      MHCKPT_ASSIGN_OR_RETURN(Deletions deleted, ReadLocalDeletions());
      // Every save made until now; the view's own, whatever its clock said.
      int64_t now = NowUnixMs();
      if (local) now = std::max(now, local_->Find(step)->marker.created_unix_ms);
      int64_t& when = deleted[step];
      when = std::max(when, now);
      return store_->PutLocalDeletions(LocalDeletionsToJson(deleted));
    });
  }
  MHCKPT_RETURN_IF_ERROR(AgreeAll(recorded, comm_));
  return local ? local_->Delete(comm_, step) : OkStatus();
}

Status ManagerImpl::OpenLocalTier() {
  return RunOnIoThread([&] {
    // Bounded like every collective phase of the I/O thread: a node's
    // lowest rank stuck on its local dir must not leave the others waiting.
    Watchdog::Guard phase(watchdog_, "local open", -1);
    Status s = Guarded(fmt::format("rank {}: local tier", comm_.rank()),
                       [&] { local_ = std::make_unique<LocalTier>(options_); });
    // Rank 0 reads the saves Delete deleted (only its election uses them).
    Deletions deleted;
    if (s.ok() && comm_.rank() == 0) {
      Result<Deletions> read = ReadLocalDeletions();
      s = read.status();
      if (read.ok()) deleted = std::move(read).value();
    }
    MHCKPT_RETURN_IF_ERROR(AgreeAll(s, comm_));
    return local_->Open(comm_, options_, deleted);
  });
}

bool ManagerImpl::NextSaveIsPersistent(SaveTier tier) {
  const int64_t n = saves_++;
  last_save_call_ = std::chrono::steady_clock::now();
  if (!local_ || tier == SaveTier::kPersistent) return true;
  if (tier == SaveTier::kLocal) return false;
  return n % std::max(options_.persistent_every, 1) == 0;
}

Status ManagerImpl::Agree(const Status& local) const { return AgreeAll(local, caller_comm_); }

Status ManagerImpl::InstallPreemptionHandlers() {
  Result<std::unique_ptr<PreemptionHandlers>> h =
      PreemptionHandlers::Install(options_.preemption.signals);
  if (!h.ok())
    return Status(h.status().code(), fmt::format("rank {}: {}", rank(), h.status().message()));
  preemption_handlers_ = std::move(h).value();
  return OkStatus();
}

bool ManagerImpl::SaveInFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return saves_in_flight_ > 0 || (drain_ != nullptr && drains_.FirstUnabandoned() >= 0);
}

const StepDecision& ManagerImpl::DecideStep(int64_t step) {
  if (!step_agreement_) {
    step_agreement_ = std::make_unique<StepAgreement>(Comm::Duplicate(caller_comm_.get()));
  }
  // Ready for a continuous save: none in flight here, and the minimum
  // interval since the last Save call has passed.
  bool ready = false;
  if (options_.save_continuously) {
    const double since =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save_call_).count();
    ready = !SaveInFlight() && (saves_ == 0 || since >= options_.min_save_interval_seconds);
  }
  return step_agreement_->Decide(step, ready, saves_);
}

std::optional<io::MarkerPreemption> ManagerImpl::PreemptionRecord(int64_t step) const {
  if (!step_agreement_ || step_agreement_->preemption_step() != step) return std::nullopt;
  io::MarkerPreemption p;
  p.notice_unix_ms = step_agreement_->notice_unix_ms();
  p.grace_ms = static_cast<int64_t>(options_.preemption.grace_seconds * 1000);
  return p;
}

void ManagerImpl::Drain() {
  if (async_) thread_->Drain();
}

SaveTimings ManagerImpl::last_timings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_timings_;
}

}  // namespace mhckpt::internal
