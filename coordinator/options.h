// The options of mhckpt's CheckpointManager (coordinator/checkpoint_manager.h,
// which includes this header): the manager's Options, given at Open and the
// same on every rank, and the options of one Save, Restore or Verify, with
// the limits on what Save accepts. Every field has a default that is right
// for most jobs; each says what it trades.
#pragma once

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace mhckpt {

/// Free-form key/value pairs stored in the commit marker (docs/FORMAT.md).
/// Keys and values are UTF-8 text (they are JSON strings in the marker).
using UserMetadata = std::map<std::string, std::string>;

/// What Save accepts as user metadata: at most this many entries, keys of 1
/// to kMaxMetadataKeyBytes bytes, keys and values of at most
/// kMaxMetadataBytes together, all valid UTF-8.
inline constexpr size_t kMaxMetadataEntries = 65536;
inline constexpr size_t kMaxMetadataKeyBytes = 1024;
inline constexpr size_t kMaxMetadataBytes = size_t{64} << 20;
/// The largest step number: a step directory's name holds at most 18 digits.
inline constexpr int64_t kMaxStep = 999'999'999'999'999'999;

/// Retention by a metric (Options::keep_best). A step's metric is the value
/// of its user metadata under `metric`, read as a number (JSON's text of a
/// number, as the Python package stores it; a value that is not one, NaN
/// included, or none counts as no metric).
struct KeepBest {
  /// The metadata key; empty: retention keeps the newest steps.
  std::string metric;
  /// Higher is better; false: lower is better. Between equal metrics the
  /// later step is better.
  bool maximize = true;
  /// Steps without the metric are kept; false: they are deleted at the next
  /// retention. Either way they do not count towards max_to_keep.
  bool keep_without_metric = true;
};

/// How ranks move array bytes to storage when saving.
enum class Transfer : uint8_t {
  /// Each rank writes its boxes on its own (the faster one on ext4 with Open
  /// MPI's OMPIO, docs/PERFORMANCE.md).
  kIndependent,
  /// Ranks write in collective rounds that the storage engine may combine
  /// into fewer, larger writes (MPI-IO two-phase I/O), which some parallel
  /// file systems prefer.
  kCollective,
};

/// How a rank's array bytes reach the data file with Transfer::kIndependent
/// (docs/PERFORMANCE.md compares them). The file is the same HDF5 file.
enum class DataPath : uint8_t {
  /// HDF5 creates the datasets and writes the metadata; the rank's writer
  /// threads pwrite its boxes at the datasets' offsets with O_DIRECT, or
  /// through the page cache where the file system has no O_DIRECT.
  kDirect,
  /// The same, always through the page cache.
  kBuffered,
  /// HDF5 writes each box as a hyperslab (H5Dwrite through MPI-IO).
  /// Transfer::kCollective always writes this way.
  kHdf5,
};

/// Which ranks write which data file of a step (Options::files;
/// docs/FORMAT.md, "Subfiles").
struct DataFiles {
  /// 0: one data file, data.h5, that every rank writes into (the default).
  /// k > 0: one subfile per k consecutive ranks. kPerNode: one per node (the
  /// ranks that share memory). With subfiles, each group of ranks writes its
  /// own file, and data.h5 holds HDF5 virtual datasets that map every array
  /// onto them, so h5py and h5dump read the global arrays as before.
  int ranks_per_file = 0;
  static constexpr int kPerNode = -1;

  static DataFiles One() { return {}; }
  static DataFiles PerNode() { return {kPerNode}; }
  static DataFiles PerRanks(int k) { return {k}; }
};

/// Preemption notices (Options::preemption): a scheduler's warning that the
/// job will be stopped soon (Slurm's `sbatch --signal=USR1@60` or
/// `scancel --signal=USR1`, a cloud spot VM's 30 s - 2 min notice).
/// CheckpointManager::ReachedPreemption turns a notice on any rank into the
/// same step on every rank, at which the job saves and exits.
struct PreemptionOptions {
  /// At Open: install a handler for each of `signals` that records a notice
  /// in this process (as NotifyPreemption does) and nothing else: the
  /// process is not stopped by them. The handlers in place before are
  /// restored when the last manager of the process that installed them is
  /// destroyed; they are not called (nothing is chained). false: no
  /// handler; notices come only from NotifyPreemption.
  bool enabled = false;
  std::vector<int> signals = {SIGTERM, SIGUSR1};
  /// The scheduler's grace period (signal to kill), in seconds, for the
  /// record in the preemption step's commit marker and its log line; 0:
  /// unknown.
  double grace_seconds = 0;
};

struct Options {
  /// How array bytes move to storage when saving; restores read independently.
  Transfer transfer = Transfer::kIndependent;
  /// With Transfer::kIndependent: how the bytes reach the file.
  DataPath data_path = DataPath::kDirect;
  /// With DataPath::kDirect or kBuffered: writer threads per rank (0: 2).
  int writer_threads = 0;
  /// Commit on a background I/O thread. Needs MPI_THREAD_MULTIPLE; without it,
  /// or when false, Save commits before returning.
  bool async = true;
  /// Open removes step directories that have no commit marker (crashed saves).
  bool remove_uncommitted_on_open = true;
  /// Open takes ownership of `root` for the manager's lifetime: rank 0 locks
  /// ROOT/mhckpt.lock (flock) and keeps a lease, ROOT/mhckpt.lease, naming
  /// its host, pid and job id with a heartbeat (docs/RELIABILITY.md, "One job
  /// per root"). While a job owns a root, another Open of it fails and
  /// removes nothing. false: a reader that takes no ownership and removes
  /// nothing (remove_uncommitted_on_open is ignored); its Save fails with
  /// FailedPrecondition. `mhckpt verify` opens roots this way.
  bool own_root = true;
  /// A lease whose heartbeat is older than this many seconds is stale. It
  /// matters only where the lock does not reach the holder (NFS or Lustre
  /// mounted without working locks): a fresh lease of a process that may be
  /// alive then keeps the root in use. The heartbeat is renewed every
  /// quarter of it. Clocks of the hosts must agree to well within it.
  double root_lease_seconds = 60;
  /// How long Open keeps trying while the root is in use (a restarted job
  /// racing its predecessor's exit); 0: fail at once.
  double root_wait_seconds = 0;
  /// After each commit, keep only the newest `max_to_keep` committed steps
  /// (0: keep all), plus those kept by `keep_period`. The newest is never
  /// deleted, unless `keep_best` chooses by a metric. Deletion runs after the commit is announced:
  /// rank 0's I/O thread retires the old step (removes its marker, then renames its directory out
  /// of the listing), and a thread of its own frees the files (an unlink of GiBs can take a second
  /// where the file system discards freed blocks); destroying the manager waits for that, and the
  /// next Open removes what a crash left.
  int max_to_keep = 0;
  /// Steps that are multiples of `keep_period` are kept for good (0: none).
  int64_t keep_period = 0;
  /// With `max_to_keep`: also keeps the oldest committed step and each later
  /// one committed at least this many seconds after the last step kept this
  /// way (Orbax's keep_time_interval, its EveryNSeconds policy), by each
  /// marker's creation time (the clock of rank 0 of the job that saved it).
  /// 0: off.
  double keep_time_interval_seconds = 0;
  /// With a metric: `max_to_keep` keeps the best steps by that metric
  /// instead of the newest (Orbax's best_fn and PyTorch Lightning's
  /// save_top_k). Steps that are multiples of `keep_period` are kept too.
  KeepBest keep_best;
  /// Most host staging memory held at once, in bytes. 0: one save's worth — a
  /// save waits (SaveTimings::budget_wait) until the previous save has written
  /// its data and given its buffer back (before its flush and commit), so host
  /// memory grows by at most one copy of the local checkpoint. Buffers are
  /// kept and reused between saves.
  size_t staging_budget_bytes = 0;
  /// Before writing, ranks holding the same box compare checksums; a mismatch
  /// (silent corruption, or non-deterministic data-parallel replicas) fails
  /// the save with DataLoss naming the array, the box and both ranks.
  bool verify_replicas = false;
  /// A collective phase (plan, write, flush, commit, restore, verify) that
  /// takes longer than this on any rank aborts the job (MPI_Abort) with a
  /// message naming the phase, the step and the rank, instead of hanging on
  /// a dead or stuck peer. 0 disables the watchdog. A restore's NCCL waits
  /// end at half of it, in an error the ranks agree on, not an abort.
  double collective_timeout_seconds = 3600;
  /// Threads copying host boxes into staging (0: up to 4, as the machine has).
  int snapshot_threads = 0;
  /// Replica-parallel saving: a box that several ranks hold (e.g. a fully
  /// replicated array) of at least this many bytes is split along its first
  /// dimension into contiguous slices, one per holder but none much under
  /// this size (at least 2), each written by a different rank, the least
  /// loaded holders (Orbax calls this replica-parallel saving). Smaller
  /// shared boxes are written whole by one holder (rank 0 for a fully
  /// replicated array). 0 = off. At scale, about a twentieth of the bytes
  /// per rank keeps the plan small and the writers even (docs/SCALE.md).
  uint64_t replica_parallel_min_bytes = 0;
  /// Each stored box is cut into chunks of whole rows (dimension 0) of about
  /// this many bytes (at least one row), and each chunk's checksum is
  /// recorded (format 3: in the step's index file; format 2: in the commit
  /// marker), so that a restore reading part of a box checks every byte it
  /// returns (RestoreOptions::verify_checksums) by reading the whole chunks
  /// around it. Larger chunks: fewer checksums, more bytes read beyond those
  /// asked for when the sharding differs from the save's. Rank 0's value is
  /// used. 0 = the default, 1 MiB (docs/PERFORMANCE.md).
  uint64_t checksum_chunk_bytes = 0;
  /// The checkpoint format this job writes (docs/FORMAT.md): 3 (the default)
  /// keeps every checksum in an index file that each writer fills in for its
  /// own boxes and each reader reads only in part, and a marker that grows
  /// with the arrays, not the chunks; 2 puts every chunk's checksum in the
  /// marker, for readers built before format 3. Every version restores.
  /// Rank 0's value is used.
  int format_version = 3;
  /// One data file per step (the default), or one per node or per group of
  /// ranks, behind a data.h5 of virtual datasets. Subfiles need format 3 and
  /// DataPath::kDirect or kBuffered. On a parallel file system they spare
  /// the ranks of different groups each other's locks on one shared file;
  /// on one local disk they gain nothing (docs/SCALE.md). Every rank must
  /// pass the same value.
  DataFiles files;
  /// The bytes this rank will stage per save, if known (e.g. its share of
  /// the model and optimizer state): Open then maps that much staging memory
  /// and touches it on a thread of its own while training starts, so that
  /// the first Save costs a memcpy instead of page faults on fresh memory
  /// (or waits only for what is left of the touching). Reserve does the same
  /// later. 0 (the default): staging is mapped and touched by the first save.
  /// Ignored if larger than staging_budget_bytes (when that is set).
  uint64_t staging_reserve_bytes = 0;
  /// When the manager is destroyed, keep its largest staging buffer mapped
  /// for the next manager of the process opened with this set too (at most
  /// one buffer is kept, until such a manager takes it). For code that opens
  /// a manager per save — a directory per checkpoint, as PyTorch DCP's
  /// `checkpoint_id` (the Python package's mhckpt.torch sets it) — so that
  /// every save copies into touched memory, not only the first.
  bool carry_staging_over = false;

  // ---- The local tier (docs/TIERS.md) ----

  /// A node-local directory (a tmpfs such as /dev/shm/NAME, or a local NVMe)
  /// that turns on the local tier: every save is committed there first, each
  /// node holding its own ranks' boxes and a copy of another node's, and the
  /// shared root gets only every `persistent_every`th save. Each node sees its
  /// own directory under this one path; the lowest rank of each node owns it
  /// (a lock and lease, as for the root). "" (the default): one tier, every
  /// save goes to the shared root. It may differ between ranks (a test that
  /// simulates nodes on one machine gives each its own).
  std::string local_dir;
  /// With `local_dir`: the 1st save of this manager and every Nth after it
  /// (saves 1, N+1, 2N+1, ...) also go to the shared root; the others stay
  /// in the local tier. 1: every save goes to both tiers. SaveOptions
  /// overrides it per save. The same on every rank (Open checks).
  int persistent_every = 1;
  /// Steps the local tier keeps on each node (node memory is small), newest
  /// first; at least 1. A step still read by a drain (or a restore) is kept
  /// past this count until it is released. A save never touches an older
  /// committed step before its own commit is agreed, so a node's local dir
  /// holds up to local_max_to_keep + 1 steps: the dropped step is kept as a
  /// spare whose files the next save overwrites in place (a tmpfs then
  /// reuses its pages).
  int local_max_to_keep = 2;
  /// Copies of each rank's boxes on other nodes (the next nodes of a ring
  /// over the nodes). A job on one node has no other node to copy to: its
  /// local tier survives process crashes, not the node's loss, and it says
  /// so once in the log. The same on every rank (Open checks), as are
  /// local_max_to_keep and whether local_dir is set.
  int local_copies = 1;
  /// XOR parity instead of copies (SCR's XOR scheme): 0 (the default) keeps
  /// `local_copies` copies; g >= 2 groups the nodes in runs of g (a last run
  /// of one node joins the run before it), and the ranks at the same
  /// position on the nodes of a run form a parity group. Each member keeps
  /// a parity block of 1/(g-1) of the group's largest file, so the group
  /// survives the loss of any one of its nodes for 1/(g-1) of the memory of
  /// a copy. A rank alone at its position in a run (nodes of unequal size) is
  /// not protected: its boxes are on its own node only, Open says so once in
  /// the log (rank 0), and a local step does not survive the loss of that
  /// node (Steps no longer lists it as local; a restore falls back to the
  /// shared root). The same on every rank (Open checks).
  int local_parity_group = 0;
  /// With `local_dir`: > 0 moves the shared root's part of a save (write,
  /// flush, commit, retention) onto a thread of its own (the drain), so that
  /// a stuck shared file system does not stop training. The drain reads each
  /// rank's file of the local step, which stays held (never recycled nor
  /// dropped) until it ends; the staging buffer goes back at the local
  /// commit. A save whose local commit failed is not drained (it fails in
  /// both tiers). Each part gets this many seconds from its own start
  /// (WaitUntilFinished says how it waits); a part still unfinished on any
  /// rank by then (seen by WaitUntilFinished, or when the next save to the
  /// shared root starts) is abandoned with an agreed IoError naming the step
  /// and the rank, together with the parts queued behind it — each step stays
  /// in the local tier, and if its write ends later no marker is put — and
  /// saves go on in the local tier. While an abandoned write is still stuck, later
  /// saves skip the shared root (and log it); once it has ended, they go
  /// there again. The watchdog (collective_timeout_seconds) does not watch
  /// this part: MPI_Abort stays for collectives that can no longer agree.
  /// Destroying the manager waits for a stuck write to end. 0 (the default):
  /// the shared root's part runs on the I/O thread, within the save. The
  /// same on every rank (Open checks).
  double persistent_deadline_seconds = 0;
  /// Which node this rank is on, for tests that simulate nodes on one
  /// machine: ranks with the same value are one node. -1 (the default): the
  /// node is the shared-memory domain of MPI_Comm_split_type.
  int node_id = -1;

  // ---- Preemption and the save policy (ReachedPreemption, ShouldSave) ----

  /// Signal handlers for preemption notices (PreemptionOptions).
  PreemptionOptions preemption;
  /// ShouldSave: every step that is a multiple of this (0: none by interval).
  /// The same on every rank (Open checks).
  int64_t save_interval_steps = 0;
  /// ShouldSave: also save whenever the previous save has finished on every
  /// rank and at least `min_save_interval_seconds` have passed since the
  /// last Save call (Orbax's continuous checkpointing). The same on every
  /// rank (Open checks).
  bool save_continuously = false;
  double min_save_interval_seconds = 0;
};

/// Where a save goes, overriding Options::persistent_every for one save.
enum class SaveTier : uint8_t {
  kAuto,        ///< as Options::persistent_every says
  kLocal,       ///< the local tier only
  kPersistent,  ///< the local tier (if any) and the shared root
};

/// When Save copies the caller's buffers.
enum class CopyMode : uint8_t {
  /// Save returns once every box is copied (the default).
  kBlocking,
  /// Save checks its input and returns; the copies run on mhckpt's threads
  /// (at the lowest priority) while the caller computes, and the SaveFence
  /// completes when every box is copied. Save takes the staging memory
  /// itself before it returns (like a blocking save, it waits while an
  /// earlier save holds the budget, Options::staging_budget_bytes).
  ///
  /// Ownership: mhckpt takes no ownership of any Shard::data buffer; it keeps
  /// only the pointer. From the call to Save until the copy has ended -- the
  /// fence is complete (SaveFence::Wait has returned or SaveFence::Done is
  /// true), SaveOptions::on_copied has been called, or WaitUntilFinished has
  /// returned -- the caller must keep every buffer it passed allocated,
  /// mapped, readable and unchanged: not write, free, unmap, recycle, donate
  /// or delete it, nor let a garbage collector or allocator reclaim it (a
  /// temporary made only for the call must be held by the caller until
  /// then). This holds even when Save returns an error: the copier still
  /// reads this rank's valid boxes. Once the copy has ended mhckpt never
  /// reads the buffers again (the rest of the save works from its own
  /// staging memory): the caller may free or reuse them at once. The
  /// ArrayToSave list itself, its names, boxes and the metadata are copied
  /// by Save and may go when it returns. A buffer freed or changed early is
  /// a wrong or failed save: bytes changed during the copy are committed
  /// torn, with checksums of the torn bytes; a buffer that faults on read
  /// fails the save on every rank, naming the array (a training loop waits
  /// on the fence just before the optimizer step).
  ///
  /// Device boxes (Memory::kCuda) too: Save records an event on each
  /// Shard::stream and returns; the copies are queued later on mhckpt's own
  /// streams behind that event (so they see the work queued on the stream
  /// before Save, not after it) into pinned staging memory, and the fence
  /// completes once they have completed. This device path has not yet run on
  /// a GPU, in CI or on the development machines (it is compiled, and its
  /// tests skip without a device). The rest of the save (plan, write, commit)
  /// starts after the copy, in the background, as for a blocking save.
  /// Without asynchronous saves (Options::async false, or no
  /// MPI_THREAD_MULTIPLE) Save copies before it returns, as kBlocking does.
  kLazy,
};

struct SaveOptions {
  SaveTier tier = SaveTier::kAuto;
  /// kLazy: Save returns before copying and hands back a SaveFence.
  CopyMode copy = CopyMode::kBlocking;
  /// With kLazy: called once on mhckpt's copying thread when the copy has
  /// ended, with its outcome (as SaveFence::Wait returns), just before the
  /// fence completes. It must not call the CheckpointManager. The copying
  /// thread runs at the lowest priority (nice 19), so that on busy cores the
  /// copy yields to the caller's compute; a caller waiting on the fence
  /// leaves it the core.
  std::function<void(const Status&)> on_copied;
  /// With kLazy: called on the copying thread after every box is copied and
  /// before the fence completes; an error it returns fails the save on every
  /// rank. For layers above this API that can tell whether a buffer was
  /// given away during the copy (the Python package asks JAX whether an
  /// array was donated or deleted). It must not call the CheckpointManager.
  std::function<Status()> check_after_copy;
  /// With kLazy, for debugging: write-protect (mprotect) the whole pages of
  /// every host buffer saved until its copy has ended, so that a write
  /// before the fence kills the process at once with a message naming the
  /// array, the rank and the box, instead of tearing the saved bytes. Costs
  /// two mprotect calls per buffer and, on the next write after the fence, a
  /// page fault per page (docs/PERFORMANCE.md). The first and last
  /// partial pages of a buffer are not watched (they may hold other data).
  /// Device buffers are not watched.
  bool protect_host = false;
};

/// Which tier a restore reads.
enum class RestoreSource : uint8_t {
  kAny,         ///< the local tier if it holds the step everywhere, else the shared root
  kLocal,       ///< the local tier only (NotFound if it cannot serve the step)
  kPersistent,  ///< the shared root only
};

struct RestoreOptions {
  /// Fail unless the request names exactly the arrays of the checkpoint.
  bool strict = false;
  /// Check every byte returned against the checksums of the commit marker
  /// (DataLoss on a mismatch, naming the array, the stored box, the chunk,
  /// the rank that wrote it and the rank that read it). A step saved by this
  /// version (marker format 2) is checked at any world size and sharding:
  /// each read takes the whole checksummed chunks (about 1 MiB of whole rows)
  /// of the stored boxes it overlaps. A step in format 1 is checked only where
  /// a read covers whole stored boxes (e.g. the same sharding as at save);
  /// other reads of it are not checked. False skips every check (the bytes
  /// are read as asked, no more).
  bool verify_checksums = true;
  /// Read each box that several ranks want from storage once, and pass it to
  /// the others over MPI: a replicated array that every rank wants whole is
  /// read by rank 0 and broadcast (between GPUs with NCCL where it can be),
  /// and any other box that two or more ranks want exactly (the same array,
  /// the same start and count; e.g. a tensor-parallel shard held by every
  /// data-parallel copy) is read by one of them and sent to the others.
  /// False turns off both: every rank reads every box it asked for itself
  /// (to measure the difference). Off on every rank if false on any.
  bool read_once = true;
  /// Fault in the pages of the destinations on a second thread per rank,
  /// ahead of the reads into them, so that the kernel's work on new memory
  /// (a page fault and a cleared page every 4 KiB) runs beside the copy out
  /// of the page cache instead of inside it (docs/PERFORMANCE.md, "Measurements behind the
  /// defaults"). Shared root: reads by offset (format-2 steps), batches of at least 4 MiB; local
  /// tier: a rank's host destinations of at least 4 MiB in all. False: the reading thread
  /// faults the pages itself.
  bool prefault = true;
  /// Read long runs with O_DIRECT straight into destinations that line up
  /// with the file (equal modulo the file system's direct-I/O alignment,
  /// 512 B or 4 KiB: page-aligned memory does whenever the array's rows
  /// do), several reads in flight, unless the page cache holds them
  /// (docs/PERFORMANCE.md, "Measurements behind the defaults"). Reads by offset; where the file
  /// system has no O_DIRECT, or the destination does not line up, through the page cache. False:
  /// every read goes through the page cache.
  bool direct_reads = true;
  /// Which tier to read.
  RestoreSource source = RestoreSource::kAny;
};

struct VerifyOptions {
  /// Called on every rank with the bytes this rank has checked so far and
  /// its whole share: (0, share) first, then after each read. It runs on the
  /// thread that verifies (the I/O thread when saves are asynchronous) and
  /// must not call the CheckpointManager. If it throws, it is not called
  /// again on that rank, and Verify returns Internal naming the rank, on
  /// every rank, after the walk.
  std::function<void(uint64_t done, uint64_t share)> progress;
  /// Read the long runs of a cold file with O_DIRECT (io::ReadOptions::direct;
  /// into a page-aligned buffer, as RestoreOptions::direct_reads): the bytes
  /// checked then come from the disk, not from the page cache, and the
  /// cache is not filled with a file nobody reads next. A file the page cache
  /// already holds is read from it. False: this rank reads everything
  /// through the page cache (ranks may differ; the report does not).
  bool direct_reads = true;
};

}  // namespace mhckpt
