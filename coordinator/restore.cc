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
//      out the part asked for (coordinator/checked_read.h). In a version-1
//      step only a read that covers a whole stored box (the box itself, or
//      a slice of whole rows of it) can be checked; parts of boxes are not.
//   4. Close; one agreement.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include "base/log.h"

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

size_t BoxBytes(const Box& box, DType dtype) {
  return static_cast<size_t>(Volume(box.count).value_or(0)) * DTypeSize(dtype);
}

// Step 3 for a box that several ranks want and that no whole-array broadcast
// serves (e.g. a tensor-parallel shard held by every data-parallel copy): one
// of them reads it from storage, checked like every read, and sends it to
// the others.
struct SharedRead {
  std::vector<int64_t> key;  // KeyOf: the array's index in the marker, the box
  size_t array = 0;          // index in the marker
  const Destination* d = nullptr;
  int reader = -1;              // the rank that reads it; -1: this rank alone wants it
  std::vector<int> recipients;  // where this rank is the reader: the others
};

// One (array, box) as words: index, rank of the box, start, count. The
// order of keys (lexicographic) is the order of the transfers.
std::vector<int64_t> KeyOf(size_t array, const Box& box) {
  std::vector<int64_t> key{static_cast<int64_t>(array), static_cast<int64_t>(box.start.size())};
  key.insert(key.end(), box.start.begin(), box.start.end());
  key.insert(key.end(), box.count.begin(), box.count.end());
  return key;
}

// The rank that groups `key` (its "home"): a hash of every word, so that
// the keys, and the work of grouping them, spread over the ranks.
int HomeOf(const std::vector<int64_t>& key, int size) {
  uint64_t h = 0x6d68636b7074ULL;
  for (int64_t w : key) {  // splitmix64 steps
    h += static_cast<uint64_t>(w) + 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return static_cast<int>(h % static_cast<uint64_t>(size));
}

// Collective. Finds which of `mine` (this rank's keys, each once) other
// ranks want too, without gathering every request anywhere: each key goes
// to its home rank (one all-to-all), the home groups identical keys — the
// whole key compared, not its hash — and picks one reader per group of two
// or more ranks, the member it has given the fewest bytes to read so far
// (ties: the first member at or after the home rank), so reads spread over
// the ranks. It replies (a
// second all-to-all): to each member the reader, to the reader the other
// members. Deterministic: every home walks its groups in key order. Returns
// the keys shared with other ranks, in key order.
std::vector<SharedRead> FindSharedReads(const io::Marker& m, std::vector<SharedRead> mine,
                                        const Comm& comm) {
  const int size = comm.size();
  std::vector<std::vector<int64_t>> to_home(size);
  std::vector<std::vector<size_t>> sent(size);  // indices into `mine`, in the order sent
  for (size_t k = 0; k < mine.size(); ++k) {
    const int home = HomeOf(mine[k].key, size);
    to_home[home].insert(to_home[home].end(), mine[k].key.begin(), mine[k].key.end());
    sent[home].push_back(k);
  }
  const std::vector<std::vector<int64_t>> got = comm.AllToAllValues(to_home);

  // At the home: the members of each key, each with the position of the key
  // in what that member sent.
  struct Member {
    int rank;
    size_t position;
  };
  std::map<std::vector<int64_t>, std::vector<Member>> groups;
  std::vector<size_t> received(size, 0);  // keys received from each rank
  for (int r = 0; r < size; ++r) {        // ascending: members come sorted by rank
    const std::vector<int64_t>& words = got[r];
    for (size_t at = 0; at + 2 <= words.size(); ++received[r]) {
      const size_t n = 2 + 2 * static_cast<size_t>(words[at + 1]);
      groups[std::vector<int64_t>(words.begin() + static_cast<ptrdiff_t>(at),
                                  words.begin() + static_cast<ptrdiff_t>(at + n))]
          .push_back({r, received[r]});
      at += n;
    }
  }
  // The reply to each rank, per key in the order it sent them:
  // [reader (-1: nobody else wants it), n, n recipients].
  std::vector<std::vector<std::vector<int64_t>>> reply(size);
  for (int r = 0; r < size; ++r) reply[r].resize(received[r]);
  std::map<int, uint64_t> assigned;  // bytes this home has given each rank to read
  for (const auto& [key, members] : groups) {
    if (members.size() < 2) {
      reply[members[0].rank][members[0].position] = {-1, 0};
      continue;
    }
    // Ties go to the first member at or after this home, cyclically: homes
    // are spread by the hash, so the first reads of different homes are too.
    auto after_home = [&](int r) { return (r - comm.rank() + size) % size; };
    int reader = members[0].rank;
    for (const Member& mb : members) {
      if (std::pair(assigned[mb.rank], after_home(mb.rank)) <
          std::pair(assigned[reader], after_home(reader))) {
        reader = mb.rank;
      }
    }
    const io::MarkerArray& a = m.arrays[static_cast<size_t>(key[0])];
    const auto ndim = static_cast<size_t>(key[1]);
    const std::vector<int64_t> count(key.begin() + 2 + static_cast<ptrdiff_t>(ndim), key.end());
    assigned[reader] += static_cast<uint64_t>(Volume(count).value_or(0)) * DTypeSize(a.dtype);
    std::vector<int64_t> to_reader{reader, static_cast<int64_t>(members.size() - 1)};
    for (const Member& mb : members) {
      if (mb.rank != reader) to_reader.push_back(mb.rank);
    }
    for (const Member& mb : members) {
      reply[mb.rank][mb.position] = mb.rank == reader ? to_reader : std::vector<int64_t>{reader, 0};
    }
  }
  std::vector<std::vector<int64_t>> flat(size);
  for (int r = 0; r < size; ++r) {
    for (const std::vector<int64_t>& words : reply[r]) {
      flat[r].insert(flat[r].end(), words.begin(), words.end());
    }
  }
  const std::vector<std::vector<int64_t>> back = comm.AllToAllValues(flat);

  for (int home = 0; home < size; ++home) {
    size_t at = 0;
    for (size_t k : sent[home]) {
      const std::vector<int64_t>& words = back[home];
      SharedRead& s = mine[k];
      s.reader = static_cast<int>(words[at]);
      const auto n = static_cast<size_t>(words[at + 1]);
      for (size_t i = 0; i < n; ++i) s.recipients.push_back(static_cast<int>(words[at + 2 + i]));
      at += 2 + n;
    }
  }
  std::erase_if(mine, [](const SharedRead& s) { return s.reader < 0; });
  std::sort(mine.begin(), mine.end(),
            [](const SharedRead& x, const SharedRead& y) { return x.key < y.key; });
  return mine;
}

// Bytes of pinned host memory one round of SharedTransfers lands device
// destinations in (a larger box goes alone).
constexpr size_t kSharedRoundBytes = size_t{256} << 20;
// The tag of every shared-read message; MPI's non-overtaking rule matches
// them, since both sides post them in key order.
constexpr int kSharedReadTag = 14;

// Collective over the ranks that share reads. After the batch's reads (a
// reader's host destinations are already filled): each reader sends its
// boxes to their recipients, each recipient receives them straight into its
// destination (host memory) or into pinned memory then copied up (device
// memory; so is a reader's device destination, read here). In rounds, each
// a run of `shared` (key order) whose device boxes fit kSharedRoundBytes; a
// rank whose rounds are cut elsewhere cannot deadlock, since the smallest
// unfinished transfer is in the current round of each of its two ends.
// Every rank takes part in every transfer, even after an error (a reader
// that failed sends meaningless bytes); `local` is this rank's error so far.
Status SharedTransfers(const std::vector<SharedRead>& shared, const io::Marker& m,
                       const std::vector<size_t>& handles, ReadBatch& batch, const Comm& comm,
                       Status local) {
  PinnedBuffer pinned;
  std::vector<MPI_Request> requests;
  std::vector<std::byte*> host;  // where each transfer of the round lands or leaves from
  for (size_t begin = 0; begin < shared.size();) {
    size_t end = begin, pinned_bytes = 0;
    std::vector<size_t> at;
    for (; end < shared.size(); ++end) {
      const SharedRead& s = shared[end];
      const size_t bytes =
          s.d->memory == Memory::kCuda ? BoxBytes(s.d->box, m.arrays[s.array].dtype) : 0;
      if (end > begin && pinned_bytes + bytes > kSharedRoundBytes) break;
      at.push_back(pinned_bytes);
      pinned_bytes += bytes;
    }
    if (pinned.size() < pinned_bytes) pinned = PinnedBuffer(pinned_bytes);
    host.clear();
    for (size_t k = begin; k < end; ++k) {
      const Destination& d = *shared[k].d;
      host.push_back(d.memory == Memory::kCuda ? pinned.data() + at[k - begin]
                                               : static_cast<std::byte*>(d.data));
    }
    if (local.ok()) {
      local = Guarded("restore", [&] {
        for (size_t k = begin; k < end; ++k) {
          const SharedRead& s = shared[k];
          if (s.reader != comm.rank() || s.d->memory != Memory::kCuda) continue;
          MHCKPT_RETURN_IF_ERROR(
              batch.Add(handles[s.array], m.arrays[s.array], s.d->box, host[k - begin]));
        }
        return batch.Flush();
      });
    }
    for (size_t k = begin; k < end; ++k) {
      const SharedRead& s = shared[k];
      const size_t bytes = BoxBytes(s.d->box, m.arrays[s.array].dtype);
      if (s.reader == comm.rank()) {
        for (int to : s.recipients) {
          comm.PostSend(host[k - begin], bytes, to, kSharedReadTag, &requests);
        }
      } else {
        comm.PostReceive(host[k - begin], bytes, s.reader, kSharedReadTag, &requests);
      }
    }
    Comm::WaitAll(&requests);
    for (size_t k = begin; local.ok() && k < end; ++k) {
      const Destination& d = *shared[k].d;
      if (d.memory != Memory::kCuda) continue;
      CopyTask t{d.data, host[k - begin], BoxBytes(d.box, m.arrays[shared[k].array].dtype),
                 d.device, d.stream};
      local = CopyHostToDevice({&t, 1});
    }
    begin = end;
  }
  return local;
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
      Logger()->info("mhckpt: device broadcasts go through MPI: {}", device_broadcast_why_);
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
  flags.push_back(options.read_once ? 0 : 1);  // agreed with the flags: off if off anywhere
  comm_.AllreduceMax(&flags);
  const bool read_once = flags.back() == 0;
  flags.pop_back();
  // Arrays every rank wants whole, read once and broadcast (below).
  auto broadcast = [&](size_t i) {
    return read_once && comm_.size() > 1 && m.arrays[i].replicated && !flags[kFlags * i + kPartly];
  };
  DeviceBroadcaster* nccl = read_once ? DeviceBroadcasterFor(m, flags, mine) : nullptr;

  // 3. Read: by offset if the marker places every wanted array.
  Status local;
  PinnedBuffer bounce;  // grown to the largest device destination
  io::ReadOptions how;
  how.by_offset = WantedReadableByOffset(m, flags);
  how.prefault = options.prefault;
  how.direct = options.direct_reads;
  Result<std::unique_ptr<io::StepReader>> reader = engine_->Open(root_, step, comm_.get(), how);
  if (!reader.ok()) {
    local = DataLoss(fmt::format("rank {}: step {}: {}", rank, step, reader.status().message()));
  }
  // Why an agreement: the dataset opens below are collective; a rank that
  // could not open the file must not leave the others alone in them.
  MHCKPT_RETURN_IF_ERROR(AgreeAll(local, comm_));

  // Boxes that several ranks want, of the arrays no broadcast serves: each
  // read once, by one of them, and sent to the others. Skipped when no such
  // array is wanted (the same on every rank: the flags are agreed).
  std::vector<SharedRead> shared;
  std::set<const Destination*> shared_dests;
  bool any_unbroadcast = false;
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    any_unbroadcast = any_unbroadcast || (flags[kFlags * i + kWanted] && !broadcast(i));
  }
  if (read_once && comm_.size() > 1 && any_unbroadcast) {
    std::vector<SharedRead> keys;
    std::set<std::vector<int64_t>> seen;  // a box asked for twice here is shared once
    for (size_t i = 0; i < m.arrays.size(); ++i) {
      auto it = mine.find(m.arrays[i].name);
      if (it == mine.end() || broadcast(i)) continue;
      for (const Destination& d : it->second->shards) {
        if (Volume(d.box.count).value_or(0) == 0) continue;
        std::vector<int64_t> key = KeyOf(i, d.box);
        if (seen.insert(key).second) keys.push_back({std::move(key), i, &d, -1, {}});
      }
    }
    shared = FindSharedReads(m, std::move(keys), comm_);
    for (const SharedRead& sr : shared) shared_dests.insert(sr.d);
  }
  // shared[first_shared[i], first_shared[i + 1]) are array i's (key order
  // starts with the array): no walk over every shared box per array.
  std::vector<size_t> first_shared(m.arrays.size() + 1, 0);
  for (const SharedRead& sr : shared) ++first_shared[sr.array + 1];
  for (size_t i = 0; i < m.arrays.size(); ++i) first_shared[i + 1] += first_shared[i];

  ReadBatch batch(**reader, m.format_version, options.verify_checksums);
  PacketBroadcast packets(batch, comm_, bounce);
  std::vector<size_t> handles(m.arrays.size(), 0);
  for (size_t i = 0; i < m.arrays.size(); ++i) {
    if (!flags[kFlags * i + kWanted]) continue;
    const io::MarkerArray& a = m.arrays[i];
    Result<size_t> handle = (*reader)->OpenArray(StoredSpec(a));
    if (!handle.ok() && local.ok()) local = handle.status();
    const size_t h = handles[i] = handle.ok() ? *handle : 0;
    auto it = mine.find(a.name);
    const int* f = &flags[kFlags * i];
    // Why a broadcast: every rank wants the whole array; one read serves all.
    // Every rank takes part, even one that failed to open it.
    if (broadcast(i) && nccl != nullptr && !f[kOnHost] && !f[kOtherDevice]) {
      local =
          ReadAndBroadcastOnDevices(batch, h, a, it->second->shards[0], rank, *nccl, bounce, local);
    } else if (broadcast(i) && ArrayBytes(a) <= PacketBroadcast::kMaxArrayBytes) {
      packets.Add(h, a, it->second->shards[0], local);
    } else if (broadcast(i)) {
      local = ReadAndBroadcast(batch, h, a, it->second->shards[0], comm_, bounce, local);
    } else if (it != mine.end() && local.ok()) {
      // (The rank is named below, with every local error.)
      local = Guarded(fmt::format("restore of step {}", step), [&] {
        MHCKPT_RETURN_IF_ERROR(ReadShards(batch, h, a, *it->second, bounce, shared_dests));
        // The shared boxes this rank reads for others into host memory go
        // with the rest of the batch (device ones: SharedTransfers).
        for (size_t k = first_shared[i]; k < first_shared[i + 1]; ++k) {
          const SharedRead& sr = shared[k];
          if (sr.reader != rank || sr.d->memory == Memory::kCuda) continue;
          MHCKPT_RETURN_IF_ERROR(batch.Add(h, a, sr.d->box, static_cast<std::byte*>(sr.d->data)));
        }
        return OkStatus();
      });
    }
  }
  packets.Send(local);
  if (local.ok())
    local = Guarded(fmt::format("restore of step {}", step), [&] { return batch.Flush(); });
  // Why point-to-point messages: only the ranks that want a box wait for it.
  local = SharedTransfers(shared, m, handles, batch, comm_, local);
  Status closed = (*reader)->Close();
  if (local.ok()) local = closed;
  if (!local.ok()) local = Status(local.code(), fmt::format("rank {}: {}", rank, local.message()));
  // 4. Agree.
  return AgreeAll(local, comm_);
}

}  // namespace mhckpt::internal
