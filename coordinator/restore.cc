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
//      ones go together, up to 64 MiB per broadcast (PacketBroadcast).
//      Every byte returned is checked (RestoreOptions::verify_checksums):
//      in a version-2 step each read takes the whole checksummed chunks of
//      the stored boxes it overlaps, checks them once they arrive, and copies
//      out the part asked for (coordinator/checked_read.h). In a version-1
//      step only a read that covers a whole stored box (the box itself, or
//      a slice of whole rows of it) can be checked; parts of boxes are not.
//   4. Close; one agreement.
#include <cstring>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/guard.h"
#include "coordinator/agree.h"
#include "coordinator/checked_read.h"
#include "coordinator/committed_step.h"
#include "coordinator/manager_impl.h"
#include "coordinator/plan.h"
#include "io/marker.h"
#include "worker/copy.h"

namespace mhckpt::internal {
namespace {

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

// Where the bytes of one destination land first: the destination itself for
// host memory; for device memory, pinned host memory shared by the
// destinations of one restore (then copied over, on the destination's device,
// in order with its stream).
class Landing {
 public:
  Landing(const Destination& d, DType dtype, PinnedBuffer& bounce)
      : d_(d), bytes_(static_cast<size_t>(Volume(d.box.count).value_or(0)) * DTypeSize(dtype)) {
    if (d.memory != Memory::kCuda) return;
    if (bounce.size() < bytes_) bounce = PinnedBuffer(bytes_);
    bounce_ = bounce.data();
  }
  [[nodiscard]] void* host() const { return bounce_ != nullptr ? bounce_ : d_.data; }
  [[nodiscard]] size_t bytes() const { return bytes_; }
  /// Moves the bytes to the device, if the destination lives there.
  [[nodiscard]] Status Finish() const {
    if (bounce_ == nullptr) return OkStatus();
    CopyTask t{d_.data, bounce_, bytes_, d_.device, d_.stream};
    return CopyHostToDevice({&t, 1});
  }

 private:
  const Destination& d_;
  size_t bytes_;
  std::byte* bounce_ = nullptr;
};

// Step 3 for an array every rank wants whole: rank 0 reads it once and
// broadcasts it. `local` is this rank's error so far.
Status ReadAndBroadcast(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                        const Destination& whole, const Comm& comm, PinnedBuffer& bounce,
                        Status local) {
  Landing land(whole, a.dtype, bounce);
  if (comm.rank() == 0 && local.ok()) {
    local = Guarded("restore", [&] {  // the rank is named with every local error
      MHCKPT_RETURN_IF_ERROR(batch.Add(handle, a, whole.box, static_cast<std::byte*>(land.host())));
      return batch.Flush();
    });
  }
  comm.BroadcastBuffer(land.host(), land.bytes(), 0);
  if (local.ok()) local = land.Finish();
  return local;
}

// Step 3 for an array every rank wants whole into device memory, with NCCL:
// rank 0 reads it into its GPU, NCCL copies it to the others' GPUs.
Status ReadAndBroadcastOnDevices(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                                 const Destination& whole, int rank, DeviceBroadcaster& nccl,
                                 PinnedBuffer& bounce, Status local) {
  Landing land(whole, a.dtype, bounce);
  if (rank == 0 && local.ok()) {
    local = Guarded("restore", [&] {
      MHCKPT_RETURN_IF_ERROR(batch.Add(handle, a, whole.box, static_cast<std::byte*>(land.host())));
      MHCKPT_RETURN_IF_ERROR(batch.Flush());
      return land.Finish();
    });
  }
  Status sent = nccl.Broadcast(whole.data, land.bytes(), 0, whole.stream);
  return local.ok() ? sent : local;
}

// Step 3 for small replicated arrays that every rank wants whole and that
// go through MPI: rank 0 reads a packet of them (one batch: sorted, joined
// reads) and broadcasts it once; every rank copies its arrays out. Every
// rank adds the same arrays in the same order (the marker and the flags are
// agreed), so every rank sends the same packets.
class PacketBroadcast {
 public:
  /// Arrays up to this size are packed; larger ones are broadcast alone.
  static constexpr size_t kMaxArrayBytes = size_t{4} << 20;
  /// A packet holds at most this many bytes.
  static constexpr size_t kPacketBytes = size_t{64} << 20;

  PacketBroadcast(ReadBatch& batch, const Comm& comm, PinnedBuffer& bounce)
      : batch_(batch), comm_(comm), bounce_(bounce) {}

  /// Packs array `a` (opened as `handle`; `whole` this rank's destination);
  /// collective when that sends the full packet first.
  void Add(size_t handle, const io::MarkerArray& a, const Destination& whole, Status& local) {
    const size_t bytes = static_cast<size_t>(Volume(a.shape).value_or(0)) * DTypeSize(a.dtype);
    if (bytes_ + bytes > kPacketBytes) Send(local);
    entries_.push_back({handle, &a, &whole, bytes_, bytes});
    bytes_ += bytes;
  }

  /// Collective: reads (rank 0), broadcasts and unpacks the packet.
  void Send(Status& local) {
    if (entries_.empty()) return;
    if (buffer_.size() < bytes_) buffer_.resize(bytes_);
    if (comm_.rank() == 0 && local.ok()) {
      local = Guarded("restore", [&] {  // the rank is named with every local error
        for (const Entry& e : entries_) {
          MHCKPT_RETURN_IF_ERROR(
              batch_.Add(e.handle, *e.a, FullBox(e.a->shape), buffer_.data() + e.at));
        }
        return batch_.Flush();
      });
    }
    // Why a broadcast: every rank wants these arrays whole; one read serves all.
    comm_.BroadcastBuffer(buffer_.data(), bytes_, 0);
    for (size_t i = 0; local.ok() && i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      Landing land(*e.whole, e.a->dtype, bounce_);
      if (e.bytes > 0) std::memcpy(land.host(), buffer_.data() + e.at, e.bytes);
      local = land.Finish();
    }
    entries_.clear();
    bytes_ = 0;
  }

 private:
  struct Entry {
    size_t handle;
    const io::MarkerArray* a;
    const Destination* whole;
    size_t at;
    size_t bytes;
  };

  ReadBatch& batch_;
  const Comm& comm_;
  PinnedBuffer& bounce_;
  std::vector<Entry> entries_;
  size_t bytes_ = 0;
  std::vector<std::byte> buffer_;
};

// Step 3 for the boxes this rank asked for of array `a`: host destinations
// are queued in `batch` (read when it is flushed), device ones read at once.
Status ReadShards(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                  const ArrayToRestore& request, PinnedBuffer& bounce) {
  for (const Destination& d : request.shards) {
    if (Volume(d.box.count).value_or(0) == 0) continue;
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

size_t ArrayBytes(const io::MarkerArray& a) {
  return static_cast<size_t>(Volume(a.shape).value_or(0)) * DTypeSize(a.dtype);
}

// This rank's device for a destination in device memory, or -1.
int DeviceOf(const Destination& d) {
  if (d.memory != Memory::kCuda) return -1;
  if (d.device >= 0) return d.device;
  Result<int> device = DeviceOfPointer(d.data);
  return device.ok() ? *device : -1;
}

// This rank's flags (step 2), and the device of its first whole-array device
// destination in `*first_device` (-1 if none).
std::vector<int> WantedFlags(const io::Marker& m,
                             const std::map<std::string_view, const ArrayToRestore*>& mine,
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

}  // namespace

// Collective; `flags` agreed. The NCCL broadcaster if some replicated array
// goes whole into device memory on every rank and NCCL can serve these ranks
// on their devices; nullptr otherwise (MPI through pinned host memory).
DeviceBroadcaster* ManagerImpl::DeviceBroadcasterFor(
    const io::Marker& m, const std::vector<int>& flags,
    const std::map<std::string_view, const ArrayToRestore*>& mine) {
  bool any = false;
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    const int* f = &flags[kFlags * i];
    any = any || (m.arrays[i].replicated && f[kWanted] && !f[kPartly] && !f[kOnHost]);
  }
  if (!any) return nullptr;  // the same on every rank: `flags` are agreed
  int device = -1;
  (void)WantedFlags(m, mine, &device);
  if (!device_broadcast_tried_) {
    device_broadcast_tried_ = true;
    device_broadcast_ = DeviceBroadcaster::Create(comm_, device, &device_broadcast_why_);
    if (!device_broadcast_ && comm_.rank() == 0) {
      spdlog::info("mhckpt: device broadcasts go through MPI: {}", device_broadcast_why_);
    }
  }
  if (!device_broadcast_) return nullptr;
  bool moved = comm_.AllreduceMax(device_broadcast_->device() != device ? 1 : 0) != 0;
  return moved ? nullptr : device_broadcast_.get();
}

Status ManagerImpl::RunRestore(int64_t step, std::span<const ArrayToRestore> arrays,
                               const RestoreOptions& options) {
  const int rank = comm_.rank();

  // 1. The marker, from rank 0.
  MHCKPT_ASSIGN_OR_RETURN(io::Marker m, ReadMarkerEverywhere(comm_, root_, step));

  // 2. Check the requests; learn what everyone wants.
  const std::string where = fmt::format("rank {}: restore of step {}", rank, step);
  MHCKPT_RETURN_IF_ERROR(
      AgreeAll(Guarded(where, [&] { return CheckRequests(m, arrays, options, rank); }), comm_));
  std::map<std::string_view, const ArrayToRestore*> mine;
  for (const ArrayToRestore& a : arrays) mine[a.name] = &a;
  std::vector<int> flags = WantedFlags(m, mine);
  comm_.AllreduceMax(&flags);
  DeviceBroadcaster* nccl = DeviceBroadcasterFor(m, flags, mine);

  // 3. Read: by offset if the marker places every wanted array.
  Status local;
  PinnedBuffer bounce;  // grown to the largest device destination
  io::ReadOptions how;
  how.by_offset = WantedReadableByOffset(m, flags);
  Result<std::unique_ptr<io::StepReader>> reader = engine_->Open(root_, step, comm_.get(), how);
  if (!reader.ok()) {
    local = DataLoss(fmt::format("rank {}: step {}: {}", rank, step, reader.status().message()));
  }
  // Why an agreement: the dataset opens below are collective; a rank that
  // could not open the file must not leave the others alone in them.
  MHCKPT_RETURN_IF_ERROR(AgreeAll(local, comm_));
  ReadBatch batch(**reader, m.format_version, options.verify_checksums);
  PacketBroadcast packets(batch, comm_, bounce);
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (!flags[kFlags * i + kWanted]) continue;
    const io::MarkerArray& a = m.arrays[i];
    Result<size_t> handle = (*reader)->OpenArray(StoredSpec(a));
    if (!handle.ok() && local.ok()) local = handle.status();
    const size_t h = handle.ok() ? *handle : 0;
    auto it = mine.find(a.name);
    const int* f = &flags[kFlags * i];
    // Why a broadcast: every rank wants the whole array; one read serves all.
    // Every rank takes part, even one that failed to open it.
    if (a.replicated && !f[kPartly] && nccl != nullptr && !f[kOnHost] && !f[kOtherDevice]) {
      local =
          ReadAndBroadcastOnDevices(batch, h, a, it->second->shards[0], rank, *nccl, bounce, local);
    } else if (a.replicated && !f[kPartly] && ArrayBytes(a) <= PacketBroadcast::kMaxArrayBytes) {
      packets.Add(h, a, it->second->shards[0], local);
    } else if (a.replicated && !f[kPartly]) {
      local = ReadAndBroadcast(batch, h, a, it->second->shards[0], comm_, bounce, local);
    } else if (it != mine.end() && local.ok()) {
      // (The rank is named below, with every local error.)
      local = Guarded(fmt::format("restore of step {}", step),
                      [&] { return ReadShards(batch, h, a, *it->second, bounce); });
    }
  }
  packets.Send(local);
  if (local.ok())
    local = Guarded(fmt::format("restore of step {}", step), [&] { return batch.Flush(); });
  Status closed = (*reader)->Close();
  if (local.ok()) local = closed;
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));
  // 4. Agree.
  return AgreeAll(local, comm_);
}

}  // namespace mhckpt::internal
