// Restore of one committed step, run by every rank on its I/O thread:
//
//   1. Rank 0 reads the commit marker and broadcasts it (no marker: the step
//      is not committed, NotFound everywhere).
//   2. Each rank checks its own requests against the marker; one agreement.
//      One allreduce tells every rank which arrays anybody wants, and whether
//      every rank wants all of a replicated array.
//   3. All ranks open the step and agree that they could. If the marker
//      records the file offset of every wanted array (format version 2),
//      the step is read by offset: each rank opens the data file once,
//      read-only, and preads its boxes there, opening no dataset
//      (io/pread_reader.h); otherwise (version 1) through the engine, which
//      opens each wanted dataset collectively; a rank that fails to open
//      one still takes part in the array's broadcast, carrying its error.
//      Each rank queues the reads of its boxes in one batch, read sorted by
//      file offset and joined across small arrays (ReadBatch), so any
//      sharding on any world size is a plain read. A replicated array that
//      every rank wants whole is read once by rank 0 and broadcast; small
//      ones go together, up to 64 MiB per broadcast (PacketBroadcast;
//      coordinator/read_once.h).
//      Any other box that several ranks want exactly (the same array, start
//      and count: a tensor-parallel shard held by every data-parallel copy)
//      is read once too: before the reads, each rank sends its keys (array,
//      box) to a home rank chosen by their hash (one all-to-all); each home
//      groups identical keys, picks a reader per group of two or more ranks
//      (the member it gave the fewest bytes so far) and replies to each
//      member (a second all-to-all) (FindSharedReads). The reader reads the
//      box with its other reads, checked like them, and after the batch sends
//      it to the others point to point, who receive it straight into their
//      destination (or pinned memory, for device memory); in key order, one
//      tag (SharedTransfers). Every rank takes part in every transfer even
//      after an error. RestoreOptions::read_once = false (on any rank) turns
//      off both this and the broadcasts: each rank reads what it asked for.
//      Every byte returned is checked (RestoreOptions::verify_checksums):
//      in a version-2 step each read takes the whole checksummed chunks of
//      the stored boxes it overlaps, checks them once they arrive, and copies
//      out the part asked for (coordinator/checked_read.h); in a version-3
//      step the checksums of those stored boxes are read first, from their
//      records in the step's index and nothing else of it (IndexSource). In a version-1
//      step only a read that covers a whole stored box (the box itself, or
//      a slice of whole rows of it) can be checked; parts of boxes are not.
//   4. Close; one agreement.
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "coordinator/read_once.h"
#include "io/layout.h"
#include "io/marker.h"
#include "worker/copy.h"

namespace mhckpt::internal {
// Checks this rank's requests against the marker (step 2).
Status CheckRequests(const io::Marker& m, std::span<const ArrayToRestore> arrays,
                     const RestoreOptions& options, int rank) {
  std::set<std::string_view> names;
  for (const ArrayToRestore& a : arrays) {
    // Names not in the marker are quoted escaped and cut short: they may be
    // any bytes, of any length.
    if (!names.insert(a.name).second) {
      return InvalidArgument(
          fmt::format("array '{}' on rank {}: requested twice", QuoteForMessage(a.name), rank));
    }
    const io::MarkerArray* stored = m.Find(a.name);
    if (stored == nullptr) {
      return NotFound(fmt::format("array '{}' (requested on rank {}) is not in step {}",
                                  QuoteForMessage(a.name), rank, m.step));
    }
    if (a.dtype != stored->dtype) {
      return InvalidArgument(fmt::format("array '{}' on rank {}: requested as {}, stored as {}",
                                         a.name, rank, DTypeName(a.dtype),
                                         DTypeName(stored->dtype)));
    }
    for (const Destination& d : a.shards) {
      auto where = [&] {
        return fmt::format("array '{}' on rank {}, box {}", a.name, rank, BoxToString(d.box));
      };
      if (d.memory != Memory::kHost && d.memory != Memory::kCuda) {
        return InvalidArgument(
            fmt::format("{}: invalid memory kind {}", where(), static_cast<int>(d.memory)));
      }
      if (std::string why = CheckBoxInShape(d.box, stored->shape); !why.empty()) {
        return InvalidArgument(fmt::format("{}: box outside shape {}: {}", where(),
                                           ShapeToString(stored->shape), why));
      }
      if (d.data == nullptr && Volume(d.box.count).value_or(0) > 0) {
        return InvalidArgument(fmt::format("{}: data is null", where()));
      }
      if (d.memory == Memory::kCuda && !CudaAvailable()) {
        return InvalidArgument(
            fmt::format("{}: device memory, but no CUDA device is usable", where()));
      }
    }
  }
  if (options.strict) {
    for (const io::MarkerArray& a : m.arrays) {
      if (!names.count(a.name)) {
        return InvalidArgument(
            fmt::format("strict restore: array '{}' of step {} is not requested "
                        "on rank {}",
                        a.name, m.step, rank));
      }
    }
  }
  return OkStatus();
}

namespace {

// Step 3 for the boxes this rank asked for of array `a`, but those in
// `shared` (read once for several ranks, SharedRead): host destinations are
// queued in `batch` (read when it is flushed), device ones read at once.
Status ReadShards(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                  const ArrayToRestore& request, PinnedBuffer& bounce,
                  const std::set<const Destination*>& shared) {
  for (const Destination& d : request.shards) {
    if (Volume(d.box.count).value_or(0) == 0 || shared.count(&d)) continue;
    Landing land(d, a.dtype, bounce);
    const bool device = land.host() != d.data;
    if (device) MHCKPT_RETURN_IF_ERROR(batch.Flush());  // the pinned buffer is shared
    MHCKPT_RETURN_IF_ERROR(batch.Add(handle, a, d.box, static_cast<std::byte*>(land.host())));
    if (!device) continue;
    MHCKPT_RETURN_IF_ERROR(batch.Flush());
    MHCKPT_RETURN_IF_ERROR(land.Finish());
  }
  return OkStatus();
}

// Per array, OR-ed over ranks: wanted at all; wanted by some rank other than
// whole at once; wanted whole into host memory; wanted whole into device
// memory on another device than this rank's first such array.
enum : size_t { kWanted, kPartly, kOnHost, kOtherDevice, kFlags };

// Every array someone wants (`flags`, agreed) can be read by offset: the
// same answer on every rank.
bool WantedReadableByOffset(const io::Marker& m, const std::vector<int>& flags) {
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (flags[kFlags * i + kWanted] && !ReadableByOffset(m.arrays[i])) return false;
  }
  return true;
}

// This rank's device for a destination in device memory, or -1.
int DeviceOf(const Destination& d) {
  if (d.memory != Memory::kCuda) return -1;
  if (d.device >= 0) return d.device;
  Result<int> device = DeviceOfPointer(d.data);
  return device.ok() ? *device : -1;
}

// This rank's requests, by name.
using Requests = std::map<std::string_view, const ArrayToRestore*>;

// This rank's flags (step 2), and the device of its first whole-array device
// destination in `*first_device` (-1 if none).
std::vector<int> WantedFlags(const io::Marker& m, const Requests& mine,
                             int* first_device = nullptr) {
  std::vector<int> flags(kFlags * m.arrays.size(), 0);
  int first = -1;
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    int* f = &flags[kFlags * i];
    auto it = mine.find(m.arrays[i].name);
    bool whole = it != mine.end() && it->second->shards.size() == 1 &&
                 it->second->shards[0].box == FullBox(m.arrays[i].shape);
    f[kWanted] = it != mine.end() ? 1 : 0;
    f[kPartly] = whole ? 0 : 1;
    if (!whole) continue;
    int device = DeviceOf(it->second->shards[0]);
    f[kOnHost] = device < 0 ? 1 : 0;
    if (device >= 0 && first < 0) first = device;
    f[kOtherDevice] = device >= 0 && device != first ? 1 : 0;
  }
  if (first_device != nullptr) *first_device = first;
  return flags;
}

// One restore on one rank: the steps of the protocol above, in order.
class RestoreRun {
 public:
  RestoreRun(const Comm& comm, io::Engine& engine, io::RootStore& store,
             DeviceBroadcasts& device_broadcasts, int64_t step,
             std::span<const ArrayToRestore> arrays, const RestoreOptions& options)
      : comm_(comm),
        engine_(engine),
        store_(store),
        device_broadcasts_(device_broadcasts),
        step_(step),
        arrays_(arrays),
        options_(options),
        rank_(comm.rank()) {}

  Status Run() {
    // 1. The marker, from rank 0.
    MHCKPT_ASSIGN_OR_RETURN(m_, ReadMarkerEverywhere(comm_, store_, step_));
    MHCKPT_RETURN_IF_ERROR(LearnWants());
    MHCKPT_RETURN_IF_ERROR(Open());
    FindShared();
    Read();
    // 4. Close; agree.
    Status closed = reader_->Close();
    if (local_.ok()) local_ = closed;
    if (!local_.ok()) {
      local_ = Status(local_.code(), fmt::format("rank {}: {}", rank_, local_.message()));
    }
    return AgreeAll(local_, comm_);
  }

 private:
  // 2. Check the requests; learn what everyone wants.
  Status LearnWants() {
    const std::string where = fmt::format("rank {}: restore of step {}", rank_, step_);
    MHCKPT_RETURN_IF_ERROR(AgreeAll(
        Guarded(where, [&] { return CheckRequests(m_, arrays_, options_, rank_); }), comm_));
    for (const ArrayToRestore& a : arrays_) mine_[a.name] = &a;
    flags_ = WantedFlags(m_, mine_);
    flags_.push_back(options_.read_once ? 0 : 1);  // agreed with the flags: off if off anywhere
    comm_.AllreduceMax(&flags_);
    read_once_ = flags_.back() == 0;
    flags_.pop_back();
    nccl_ = read_once_ ? DeviceBroadcasterFor() : nullptr;
    return OkStatus();
  }

  // 2, collective: the NCCL broadcaster if some replicated array goes whole
  // into device memory on every rank and NCCL can serve these ranks on their
  // devices; nullptr otherwise (MPI through pinned host memory).
  DeviceBroadcaster* DeviceBroadcasterFor() {
    bool any = false;
    for (size_t i = 0; i < m_.arrays.size(); ++i) {
      const int* f = &flags_[kFlags * i];
      any = any || (m_.arrays[i].replicated && f[kWanted] && !f[kPartly] && !f[kOnHost]);
    }
    if (!any) return nullptr;  // the same on every rank: `flags_` are agreed
    int device = -1;
    (void)WantedFlags(m_, mine_, &device);
    return device_broadcasts_.For(comm_, device);
  }

  // 2: array i is one that every rank wants whole, read once and broadcast.
  [[nodiscard]] bool IsBroadcast(size_t i) const {
    return read_once_ && comm_.size() > 1 && m_.arrays[i].replicated &&
           !flags_[kFlags * i + kPartly];
  }

  // 3. Open the step: by offset if the marker places every wanted array.
  Status Open() {
    io::ReadOptions how;
    // With subfiles every box is read by offset from its subfile.
    how.by_offset = m_.files > 0 || WantedReadableByOffset(m_, flags_);
    how.files = m_.files;
    how.prefault = options_.prefault;
    how.direct = options_.direct_reads;
    Result<std::unique_ptr<io::StepReader>> reader = engine_.Open(store_.root(), step_, comm_, how);
    if (!reader.ok()) {
      local_ =
          DataLoss(fmt::format("rank {}: step {}: {}", rank_, step_, reader.status().message()));
    } else {
      reader_ = std::move(reader).value();
    }
    // Why an agreement: the dataset opens below are collective; a rank that
    // could not open the file must not leave the others alone in them.
    return AgreeAll(local_, comm_);
  }

  // 3, before the reads: boxes that several ranks want, of the arrays no
  // broadcast serves: each read once, by one of them, and sent to the
  // others. Skipped when no such array is wanted (the same on every rank:
  // the flags are agreed).
  void FindShared() {
    bool any_unbroadcast = false;
    for (size_t i = 0; i < m_.arrays.size(); ++i) {
      any_unbroadcast = any_unbroadcast || (flags_[kFlags * i + kWanted] && !IsBroadcast(i));
    }
    if (read_once_ && comm_.size() > 1 && any_unbroadcast) {
      std::vector<SharedRead> keys;
      std::set<std::vector<int64_t>> seen;  // a box asked for twice here is shared once
      for (size_t i = 0; i < m_.arrays.size(); ++i) {
        auto it = mine_.find(m_.arrays[i].name);
        if (it == mine_.end() || IsBroadcast(i)) continue;
        for (const Destination& d : it->second->shards) {
          if (Volume(d.box.count).value_or(0) == 0) continue;
          std::vector<int64_t> key = KeyOf(i, d.box);
          if (seen.insert(key).second) keys.push_back({std::move(key), i, &d, -1, {}});
        }
      }
      shared_ = FindSharedReads(m_, std::move(keys), comm_);
      for (const SharedRead& sr : shared_) shared_dests_.insert(sr.d);
    }
    // shared_[first_shared_[i], first_shared_[i + 1]) are array i's (key
    // order starts with the array): no walk over every shared box per array.
    first_shared_.assign(m_.arrays.size() + 1, 0);
    for (const SharedRead& sr : shared_) ++first_shared_[sr.array + 1];
    for (size_t i = 0; i < m_.arrays.size(); ++i) first_shared_[i + 1] += first_shared_[i];
  }

  // 3, the reads: every wanted array in one batch, the broadcasts, then the
  // shared boxes sent.
  void Read() {
    std::optional<IndexSource> index;
    if (m_.format_version >= 3 && (options_.verify_checksums || m_.files > 0)) {
      index.emplace(io::IndexPath(store_.root(), step_), &m_);
    }
    ReadBatch batch(*reader_, m_.format_version, options_.verify_checksums, nullptr,
                    index ? &*index : nullptr);
    PacketBroadcast packets(batch, comm_, bounce_);
    handles_.assign(m_.arrays.size(), 0);
    for (size_t i = 0; i < m_.arrays.size(); ++i) {
      if (flags_[kFlags * i + kWanted]) ReadArray(i, batch, packets);
    }
    packets.Send(local_);
    if (local_.ok()) {
      local_ = Guarded(fmt::format("restore of step {}", step_), [&] { return batch.Flush(); });
    }
    // Why point-to-point messages: only the ranks that want a box wait for it.
    local_ = SharedTransfers(shared_, m_, handles_, batch, comm_, local_);
  }

  // 3, one wanted array: opened (collectively), then broadcast or queued.
  void ReadArray(size_t i, ReadBatch& batch, PacketBroadcast& packets) {
    const io::MarkerArray& a = m_.arrays[i];
    Result<size_t> handle = reader_->OpenArray(StoredSpec(a));
    if (!handle.ok() && local_.ok()) local_ = handle.status();
    const size_t h = handles_[i] = handle.ok() ? *handle : 0;
    auto it = mine_.find(a.name);
    const int* f = &flags_[kFlags * i];
    // Why a broadcast: every rank wants the whole array; one read serves all.
    // Every rank takes part, even one that failed to open it.
    if (IsBroadcast(i) && nccl_ != nullptr && !f[kOnHost] && !f[kOtherDevice]) {
      local_ = ReadAndBroadcastOnDevices(batch, h, a, it->second->shards[0], comm_, *nccl_, bounce_,
                                         local_);
    } else if (IsBroadcast(i) && PacketBroadcast::Packs(a)) {
      packets.Add(h, a, it->second->shards[0], local_);
    } else if (IsBroadcast(i)) {
      local_ = ReadAndBroadcast(batch, h, a, it->second->shards[0], comm_, bounce_, local_);
    } else if (it != mine_.end() && local_.ok()) {
      // (The rank is named in step 4, with every local error.)
      local_ = Guarded(fmt::format("restore of step {}", step_),
                       [&] { return QueueMine(i, h, *it->second, batch); });
    }
  }

  // 3, array i (opened as `h`) that no broadcast serves: this rank's boxes,
  // and the shared boxes it reads for others into host memory, with the
  // rest of the batch (device ones: SharedTransfers).
  Status QueueMine(size_t i, size_t h, const ArrayToRestore& request, ReadBatch& batch) {
    const io::MarkerArray& a = m_.arrays[i];
    MHCKPT_RETURN_IF_ERROR(ReadShards(batch, h, a, request, bounce_, shared_dests_));
    for (size_t k = first_shared_[i]; k < first_shared_[i + 1]; ++k) {
      const SharedRead& sr = shared_[k];
      if (sr.reader != rank_ || sr.d->memory == Memory::kCuda) continue;
      MHCKPT_RETURN_IF_ERROR(batch.Add(h, a, sr.d->box, static_cast<std::byte*>(sr.d->data)));
    }
    return OkStatus();
  }

  const Comm& comm_;
  io::Engine& engine_;
  io::RootStore& store_;
  DeviceBroadcasts& device_broadcasts_;
  const int64_t step_;
  const std::span<const ArrayToRestore> arrays_;
  const RestoreOptions& options_;
  const int rank_;

  io::Marker m_;                               // step 1
  Requests mine_;                              // from step 2 on
  std::vector<int> flags_;                     // agreed, kFlags per array
  bool read_once_ = false;                     // agreed
  DeviceBroadcaster* nccl_ = nullptr;          // the same on every rank
  std::unique_ptr<io::StepReader> reader_;     // from step 3 on
  Status local_;                               // this rank's first error from step 3 on
  PinnedBuffer bounce_;                        // grown to the largest device destination
  std::vector<SharedRead> shared_;             // key order
  std::set<const Destination*> shared_dests_;  // the destinations in shared_
  std::vector<size_t> first_shared_;           // per array, where its shared_ start
  std::vector<size_t> handles_;                // per array, as the reader opened it
};

}  // namespace

Status ManagerImpl::RunRestore(int64_t step, std::span<const ArrayToRestore> arrays,
                               const RestoreOptions& options) {
  // The local tier's view is the same on every rank: all take the same branch.
  if (options.source != RestoreSource::kPersistent && local_) {
    if (std::shared_ptr<const LocalStep> s = local_->Find(step)) {
      return RestoreLocal(comm_, *local_, *s, arrays, options);
    }
  }
  if (options.source == RestoreSource::kLocal) {
    return NotFound(fmt::format("step {} is not in the local tier{}", step,
                                local_ ? "" : " (Options::local_dir is not set)"));
  }
  return RestoreRun(comm_, *engine_, *store_, device_broadcasts_, step, arrays, options).Run();
}

}  // namespace mhckpt::internal
