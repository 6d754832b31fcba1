// mhckpt._core: the thin map from Python objects to the public C++ API
// (coordinator/checkpoint_manager.h). Pytree walking, shardings and targets
// live in the Python modules; this file only
//   - turns (name, dtype, shape, [(start, count, buffer)]) lists into
//     ArrayToSave / ArrayToRestore (convert.h), taking each buffer by pointer
//     through the buffer protocol or DLPack (nanobind's ndarray), with no copy;
//   - releases the GIL around every call that blocks (save's snapshot,
//     restore, wait, verify, close, and the per-step rounds of
//     reached_preemption and should_save, which may wait for a rank behind);
//   - turns a non-OK Status into the mhckpt exception for its code.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/fault.h"
#include "convert.h"
#include "coordinator/checkpoint_manager.h"

namespace mhckpt::python {
namespace {

// MPI_Comm from an mpi4py handle (an address-sized integer), or the world.
MPI_Comm CommFromHandle(std::optional<uintptr_t> handle) {
  if (!handle) return MPI_COMM_WORLD;
  return reinterpret_cast<MPI_Comm>(*handle);  // NOLINT(performance-no-int-to-ptr)
}

// A Python object that mhckpt's threads keep alive (a lazy save's arrays):
// its reference is dropped with the GIL held, on whichever thread drops it
// last, or leaked once the interpreter is gone.
std::shared_ptr<nb::object> KeepAlive(nb::object o) {
  return {new nb::object(std::move(o)), [](nb::object* p) {
            if (Py_IsInitialized() == 0) {
              (void)p->release();
            } else {
              nb::gil_scoped_acquire gil;
              p->reset();
            }
            delete p;
          }};
}

// What a lazy save returns: waits (without the GIL) for its copy to end.
class PyFence {
 public:
  explicit PyFence(SaveFence fence) : fence_(std::move(fence)) {}
  // This rank's copy outcome: "" if OK, else the message of the error that
  // fails the save on every rank (raised, agreed, by wait_until_finished).
  std::string Wait() const {
    nb::gil_scoped_release release;
    Status s = fence_.Wait();
    return s.ok() ? std::string() : s.ToString();
  }
  bool Done() const { return fence_.Done(); }

 private:
  SaveFence fence_;
};

class PyManager {
 public:
  PyManager(std::optional<uintptr_t> comm, std::string root, const Options& options) {
    MPI_Comm c = CommFromHandle(comm);
    MPI_Comm_rank(c, &rank_);
    Result<std::unique_ptr<CheckpointManager>> r = [&] {
      nb::gil_scoped_release release;
      return CheckpointManager::Open(c, std::move(root), options);
    }();
    mgr_ = Check(std::move(r));
  }

  // Collective. `py_error` is an error the Python layer found on this rank;
  // it and any bad buffer here are agreed before the save starts, so that
  // every rank raises the same exception and none waits alone in the plan.
  //
  // `lazy`: Save returns before copying (CopyMode::kLazy) and the returned
  // fence completes when it has copied. Every buffer object of `specs` is
  // held (HeldBuffers) from here until the copy has ended, whatever its
  // outcome, and dropped then, before the fence completes: the objects in
  // `specs` may be temporaries that nothing else references once this call
  // returns. `check`, called with the GIL on the copying thread after a copy
  // that succeeded, returns None or why the save must fail (an array donated
  // during the copy); it holds the saved objects too, until it is called.
  PyFence Save(int64_t step, const std::vector<SaveSpec>& specs,
               const std::map<std::string, std::string>& metadata, const std::string& tier,
               bool lazy, bool protect_host, nb::object check, const PyError& py_error) {
    std::vector<ArrayToSave> arrays;
    SaveOptions so;
    std::shared_ptr<HeldBuffers> held = lazy ? std::make_shared<HeldBuffers>() : nullptr;
    Status local = Convert(py_error, [&] {
      arrays = ToSave(specs, held.get());
      so.tier = TierFromName(tier);
    });
    if (lazy) {
      so.copy = CopyMode::kLazy;
      so.protect_host = protect_host;
      // Called once the copy has ended, failed or not (and by a save that
      // falls back to copying before it returns).
      so.on_copied = [held](const Status&) { held->Release(); };
      if (!check.is_none()) {
        so.check_after_copy = [keep = KeepAlive(std::move(check)), held, rank = rank_]() -> Status {
          nb::gil_scoped_acquire gil;
          held->Release();  // under this GIL, rather than on_copied taking it again
          try {
            nb::object why = (*keep)();
            if (why.is_none()) return OkStatus();
            return InvalidArgument("rank " + std::to_string(rank) + ": " +
                                   nb::cast<std::string>(why));
          } catch (const std::exception& e) {
            return Internal("rank " + std::to_string(rank) +
                            ": the lazy save's check raised: " + e.what());
          }
        };
      }
    }
    SaveFence fence;
    Blocking([&](CheckpointManager& mgr) {
      Status s = mgr.Agree(local);
      // Save's own error (a box outside the array, a negative step) is this
      // rank's alone; the save still runs and fails on every rank alike, so
      // wait_until_finished raises it, agreed. Raising it here too would
      // raise on some ranks only.
      if (s.ok()) (void)mgr.Save(step, arrays, metadata, so, &fence);
      return s;
    });
    return PyFence(std::move(fence));
  }

  void Reserve(uint64_t bytes) {
    Blocking([&](CheckpointManager& mgr) { return mgr.Reserve(bytes); });
  }

  // Collective: raises the lowest failing rank's error on every rank, or
  // returns on every rank if `py_error` is empty everywhere
  // (CheckpointManager::Agree), for Python code that must not enter a
  // collective alone.
  void Agree(const PyError& py_error) {
    Status local = Convert(py_error, [] {});
    Blocking([&](CheckpointManager& mgr) { return mgr.Agree(local); });
  }

  void Wait() {
    Blocking([](CheckpointManager& mgr) { return mgr.WaitUntilFinished(); });
  }

  // Collective; errors found in Python or here are agreed first, as in Save.
  void Restore(int64_t step, const std::vector<RestoreSpec>& specs, bool strict,
               bool verify_checksums, bool read_once, bool prefault, bool direct_reads,
               const std::string& source, const PyError& py_error) {
    std::vector<ArrayToRestore> arrays;
    RestoreSource from = RestoreSource::kAny;
    Status local = Convert(py_error, [&] {
      arrays = ToRestore(specs);
      from = SourceFromName(source);
    });
    Blocking([&](CheckpointManager& mgr) {
      Status s = mgr.Agree(local);
      return s.ok() ? mgr.Restore(step, arrays,
                                  RestoreOptions{.strict = strict,
                                                 .verify_checksums = verify_checksums,
                                                 .read_once = read_once,
                                                 .prefault = prefault,
                                                 .direct_reads = direct_reads,
                                                 .source = from})
                    : s;
    });
  }

  // Collective: RestoreLatest, errors found in Python or here agreed first;
  // the step restored.
  int64_t RestoreLatest(const std::vector<RestoreSpec>& specs, bool strict, bool read_once,
                        bool prefault, bool direct_reads, const std::string& source,
                        const PyError& py_error) {
    std::vector<ArrayToRestore> arrays;
    RestoreSource from = RestoreSource::kAny;
    Status local = Convert(py_error, [&] {
      arrays = ToRestore(specs);
      from = SourceFromName(source);
    });
    int64_t step = -1;
    Blocking([&](CheckpointManager& mgr) {
      MHCKPT_RETURN_IF_ERROR(mgr.Agree(local));
      Result<int64_t> r = mgr.RestoreLatest(arrays, RestoreOptions{.strict = strict,
                                                                   .read_once = read_once,
                                                                   .prefault = prefault,
                                                                   .direct_reads = direct_reads,
                                                                   .source = from});
      if (r.ok()) step = *r;
      return r.status();
    });
    return step;
  }

  // Collective, without the GIL: completing the previous step's round may
  // wait for a rank that is behind.
  bool ReachedPreemption(int64_t step) {
    return Decide(step, [](CheckpointManager& mgr, int64_t s) { return mgr.ReachedPreemption(s); });
  }
  bool ShouldSave(int64_t step) {
    return Decide(step, [](CheckpointManager& mgr, int64_t s) { return mgr.ShouldSave(s); });
  }

  uint64_t Verify(int64_t step) {
    uint64_t bytes = 0;
    Blocking([&](CheckpointManager& mgr) { return mgr.Verify(step, &bytes); });
    return bytes;
  }

  void Delete(int64_t step) {
    Blocking([&](CheckpointManager& mgr) { return mgr.Delete(step); });
  }

  std::vector<int64_t> Steps() const { return Check(Mgr().CommittedSteps()); }
  // (step, persistent, local) per committed step.
  std::vector<std::tuple<int64_t, bool, bool>> Tiers() const {
    std::vector<std::tuple<int64_t, bool, bool>> out;
    for (const auto& t : Check(Mgr().Steps())) out.emplace_back(t.step, t.persistent, t.local);
    return out;
  }
  std::optional<int64_t> Latest() const { return Check(Mgr().LatestStep()); }
  nb::dict Describe(int64_t step) const { return DescriptionToDict(Check(Mgr().Describe(step))); }
  nb::dict Timings() const { return TimingsToDict(Mgr().LastSaveTimings()); }
  size_t StagingBytes() const { return Mgr().StagingBytes(); }
  bool Async() const { return Mgr().async(); }
  bool Closed() const { return mgr_ == nullptr; }

  // Collective: waits for pending saves and frees the manager. After MPI has
  // been finalized, the manager is leaked instead: its teardown would call MPI.
  void Close() {
    if (!mgr_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      (void)mgr_.release();  // NOLINT(bugprone-unused-return-value)
      return;
    }
    nb::gil_scoped_release release;
    mgr_.reset();
  }

 private:
  // Runs `call(manager)` with the GIL released, and raises its Status.
  template <typename F>
  void Blocking(F&& call) {
    CheckpointManager& mgr = Mgr();
    Status s;
    {
      nb::gil_scoped_release release;
      s = call(mgr);
    }
    Check(s);
  }

  template <typename F>
  bool Decide(int64_t step, F&& call) {
    bool out = false;
    Blocking([&](CheckpointManager& mgr) {
      Result<bool> r = call(mgr, step);
      if (r.ok()) out = *r;
      return r.status();
    });
    return out;
  }

  // This rank's Status: the Python layer's error, else the conversion's.
  template <typename F>
  Status Convert(const PyError& py_error, F&& convert) const {
    if (!py_error.first.empty()) return Status(CodeFromName(py_error.first), py_error.second);
    try {
      convert();
    } catch (const LocalError& e) {
      return InvalidArgument("rank " + std::to_string(rank_) + ": " + e.message);
    }
    return OkStatus();
  }

  CheckpointManager& Mgr() const {
    if (!mgr_) Raise(FailedPrecondition("the CheckpointManager is closed"));
    return *mgr_;
  }

  std::unique_ptr<CheckpointManager> mgr_;
  int rank_ = 0;

 public:
  // Without the GIL: a lazy save's check takes it on the copying thread,
  // which the teardown waits for.
  ~PyManager() { Close(); }
  PyManager(const PyManager&) = delete;
  PyManager& operator=(const PyManager&) = delete;
};

// Initialises MPI with MPI_THREAD_MULTIPLE unless someone (mpi4py, the
// training framework) already has. Returns true if this call initialised it.
bool InitMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return false;
  int provided = 0;
  nb::gil_scoped_release release;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  return true;
}

void FinalizeMpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    nb::gil_scoped_release release;
    MPI_Finalize();
  }
}

std::pair<int, int> WorldRankSize(std::optional<uintptr_t> comm) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(CommFromHandle(comm), &rank);
  MPI_Comm_size(CommFromHandle(comm), &size);
  return {rank, size};
}

// Options::data_path by name, as Python passes it.
std::string DataPathName(const Options& o) {
  switch (o.data_path) {
    case DataPath::kDirect: return "direct";
    case DataPath::kBuffered: return "buffered";
    case DataPath::kHdf5: return "hdf5";
  }
  return "direct";
}

void SetDataPath(Options& o, const std::string& name) {
  if (name == "direct") {
    o.data_path = DataPath::kDirect;
  } else if (name == "buffered") {
    o.data_path = DataPath::kBuffered;
  } else if (name == "hdf5") {
    o.data_path = DataPath::kHdf5;
  } else {
    throw nb::value_error(
        ("data_path must be 'direct', 'buffered' or 'hdf5', not '" + name + "'").c_str());
  }
}

std::string ThreadLevel() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  switch (level) {
    case MPI_THREAD_MULTIPLE: return "multiple";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_FUNNELED: return "funneled";
    default: return "single";
  }
}

}  // namespace
}  // namespace mhckpt::python

NB_MODULE(_core, m) {
  using namespace mhckpt;          // NOLINT(google-build-using-namespace)
  using namespace mhckpt::python;  // NOLINT(google-build-using-namespace)
  m.doc() = "mhckpt's C++ core. Use the mhckpt package, not this module.";

  m.def("_set_error_factory", [](nb::object f) { ErrorFactory() = std::move(f); });
  // Tests only: base/fault.h's Configure (the MHCKPT_FAULT syntax; "" clears).
  m.def("_configure_fault", [](const std::string& spec) { Check(fault::Configure(spec)); });
  // The dtype table (base/dtype.h), so that Python keeps no list of its own:
  // name -> (bytes per element, stored as raw bits).
  m.def("dtypes", [] {
    nb::dict d;
    for (const DTypeInfo& t : kDTypeTable) {
      d[nb::str(t.name.data(), t.name.size())] =
          nb::make_tuple(t.size, t.kind == DTypeKind::kRawBits);
    }
    return d;
  });
  // Why `name` is not a name the core takes for an array (base/types.h), or "".
  m.def("check_array_name", [](const std::string& name) { return CheckArrayName(name); });
  m.def("init_mpi", &InitMpi);
  m.def("finalize_mpi", &FinalizeMpi);
  m.def("mpi_initialized", [] {
    int i = 0;
    MPI_Initialized(&i);
    return i != 0;
  });
  m.def("mpi_finalized", [] {
    int f = 0;
    MPI_Finalized(&f);
    return f != 0;
  });
  m.def("rank_and_size", &WorldRankSize, nb::arg("comm").none());
  m.def("thread_level", &ThreadLevel);
  // Async-signal-safe in C++; from Python, any thread (it takes no lock).
  m.def("notify_preemption", [] { NotifyPreemption(); });
  m.def("clear_preemption_notice", [] { ClearPreemptionNotice(); });

  nb::class_<Options>(m, "Options")
      .def(nb::init<>())
      .def_rw("async_save", &Options::async)
      .def_rw("remove_uncommitted_on_open", &Options::remove_uncommitted_on_open)
      .def_rw("max_to_keep", &Options::max_to_keep)
      .def_rw("keep_period", &Options::keep_period)
      .def_rw("keep_time_interval_seconds", &Options::keep_time_interval_seconds)
      .def_prop_rw(
          "best_metric", [](const Options& o) { return o.keep_best.metric; },
          [](Options& o, const std::string& m) { o.keep_best.metric = m; })
      .def_prop_rw(
          "best_maximize", [](const Options& o) { return o.keep_best.maximize; },
          [](Options& o, bool b) { o.keep_best.maximize = b; })
      .def_prop_rw(
          "keep_without_metric", [](const Options& o) { return o.keep_best.keep_without_metric; },
          [](Options& o, bool b) { o.keep_best.keep_without_metric = b; })
      .def_rw("staging_budget_bytes", &Options::staging_budget_bytes)
      .def_rw("verify_replicas", &Options::verify_replicas)
      .def_rw("collective_timeout_seconds", &Options::collective_timeout_seconds)
      .def_rw("snapshot_threads", &Options::snapshot_threads)
      .def_rw("replica_parallel_min_bytes", &Options::replica_parallel_min_bytes)
      .def_rw("writer_threads", &Options::writer_threads)
      .def_rw("own_root", &Options::own_root)
      .def_rw("root_lease_seconds", &Options::root_lease_seconds)
      .def_rw("root_wait_seconds", &Options::root_wait_seconds)
      .def_rw("checksum_chunk_bytes", &Options::checksum_chunk_bytes)
      .def_rw("format_version", &Options::format_version)
      .def_prop_rw(
          "ranks_per_file", [](const Options& o) { return o.files.ranks_per_file; },
          [](Options& o, int k) { o.files.ranks_per_file = k; })
      .def_rw("local_dir", &Options::local_dir)
      .def_rw("persistent_every", &Options::persistent_every)
      .def_rw("local_max_to_keep", &Options::local_max_to_keep)
      .def_rw("local_copies", &Options::local_copies)
      .def_rw("local_parity_group", &Options::local_parity_group)
      .def_rw("persistent_deadline_seconds", &Options::persistent_deadline_seconds)
      .def_rw("node_id", &Options::node_id)
      .def_rw("staging_reserve_bytes", &Options::staging_reserve_bytes)
      .def_rw("carry_staging_over", &Options::carry_staging_over)
      .def_prop_rw("data_path", &DataPathName, &SetDataPath)
      .def_prop_rw(
          "preemption_enabled", [](const Options& o) { return o.preemption.enabled; },
          [](Options& o, bool on) { o.preemption.enabled = on; })
      .def_prop_rw(
          "preemption_signals", [](const Options& o) { return o.preemption.signals; },
          [](Options& o, std::vector<int> signals) { o.preemption.signals = std::move(signals); })
      .def_prop_rw(
          "preemption_grace_seconds", [](const Options& o) { return o.preemption.grace_seconds; },
          [](Options& o, double s) { o.preemption.grace_seconds = s; })
      .def_rw("save_interval_steps", &Options::save_interval_steps)
      .def_rw("save_continuously", &Options::save_continuously)
      .def_rw("min_save_interval_seconds", &Options::min_save_interval_seconds)
      .def_prop_rw(
          "collective_transfer",
          [](const Options& o) { return o.transfer == Transfer::kCollective; },
          [](Options& o, bool collective) {
            o.transfer = collective ? Transfer::kCollective : Transfer::kIndependent;
          });

  nb::class_<PyFence>(m, "Fence").def("wait", &PyFence::Wait).def("done", &PyFence::Done);

  nb::class_<PyManager>(m, "Manager")
      .def(nb::init<std::optional<uintptr_t>, std::string, const Options&>(),
           nb::arg("comm").none(), nb::arg("root"), nb::arg("options"))
      .def("save", &PyManager::Save, nb::arg("step"), nb::arg("specs"), nb::arg("metadata"),
           nb::arg("tier"), nb::arg("lazy"), nb::arg("protect_host"), nb::arg("check").none(),
           nb::arg("py_error"))
      .def("reserve", &PyManager::Reserve)
      .def("agree", &PyManager::Agree, nb::arg("py_error"))
      .def("wait", &PyManager::Wait)
      .def("restore", &PyManager::Restore)
      .def("restore_latest", &PyManager::RestoreLatest)
      .def("verify", &PyManager::Verify)
      .def("delete", &PyManager::Delete, nb::arg("step"))
      .def("reached_preemption", &PyManager::ReachedPreemption, nb::arg("step"))
      .def("should_save", &PyManager::ShouldSave, nb::arg("step"))
      .def("steps", &PyManager::Steps)
      .def("tiers", &PyManager::Tiers)
      .def("latest", &PyManager::Latest)
      .def("describe", &PyManager::Describe)
      .def("timings", &PyManager::Timings)
      .def("staging_bytes", &PyManager::StagingBytes)
      .def("is_async", &PyManager::Async)
      .def("closed", &PyManager::Closed)
      .def("close", &PyManager::Close);
}
