// Read once, serve several ranks: the two ways step 3 of the restore
// protocol (coordinator/restore.cc) avoids reading the same bytes twice
// (RestoreOptions::read_once), and where the bytes of a destination land.
//
//   - Whole-array broadcasts: a replicated array that every rank wants whole
//     is read by rank 0 and broadcast — with NCCL GPU to GPU
//     (ReadAndBroadcastOnDevices, through DeviceBroadcasts), alone with MPI
//     (ReadAndBroadcast), or, if small, packed with others into one MPI
//     broadcast (PacketBroadcast).
//   - Shared reads: any other box that several ranks want exactly is found
//     without gathering every request anywhere (FindSharedReads), read by one
//     of them with its other reads, then sent point to point to the others
//     (SharedTransfers).
//
// Every function here is collective where it says so, and every rank takes
// part even after an error of its own (`local`), so that no rank is left
// alone in a collective call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/comm.h"
#include "base/status.h"
#include "base/types.h"
#include "coordinator/checked_read.h"
#include "coordinator/device_broadcast.h"
#include "coordinator/watchdog.h"
#include "io/marker.h"
#include "worker/array.h"
#include "worker/copy.h"

namespace mhckpt::internal {

// Where the bytes of one destination land first: the destination itself for
// host memory; for device memory, pinned host memory shared by the
// destinations of one restore (then copied over, on the destination's device,
// in order with its stream).
class Landing {
 public:
  Landing(const Destination& d, DType dtype, PinnedBuffer& bounce)
      : d_(d), bytes_(BoxBytes(d.box, dtype)) {
    if (d.memory != Memory::kCuda) return;
    if (bounce.size() < bytes_) bounce = PinnedBuffer(bytes_, d.device);
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

// The NCCL broadcaster of one manager (I/O thread only), made on the first
// restore that can use it.
class DeviceBroadcasts {
 public:
  /// `watchdog_timeout_seconds`: the watchdog's (<= 0: none). NCCL's waits
  /// are bounded by a share of it, each restarting `watchdog` (may be null)
  /// as it begins (kNcclShareOfWatchdog, coordinator/device_broadcast.h).
  explicit DeviceBroadcasts(double watchdog_timeout_seconds = 0, Watchdog* watchdog = nullptr)
      : timeout_seconds_(NcclDeadlineSeconds(watchdog_timeout_seconds)), watchdog_(watchdog) {}

  /// Collective. The broadcaster, if NCCL can serve these ranks each on
  /// `device` (its first whole-array device destination; -1: none) and no
  /// rank's device differs from the one it was made on; nullptr otherwise
  /// (MPI through pinned host memory), said once on rank 0.
  DeviceBroadcaster* For(const Comm& comm, int device);

 private:
  double timeout_seconds_;  // NCCL's deadline (0: none)
  Watchdog* watchdog_;
  std::unique_ptr<DeviceBroadcaster> broadcaster_;
  bool tried_ = false;
  std::string why_;  // why there is none
};

// Step 3 for an array every rank wants whole: rank 0 reads it once and
// broadcasts it. `local` is this rank's error so far.
Status ReadAndBroadcast(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                        const Destination& whole, const Comm& comm, PinnedBuffer& bounce,
                        Status local);

// Step 3 for an array every rank wants whole into device memory, with NCCL:
// rank 0 reads it into its GPU, NCCL copies it to the others' GPUs.
// Collective over `comm` (DeviceBroadcaster::Broadcast agrees through it).
Status ReadAndBroadcastOnDevices(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                                 const Destination& whole, const Comm& comm,
                                 DeviceBroadcaster& nccl, PinnedBuffer& bounce, Status local);

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

  /// True if array `a` is small enough to be packed (kMaxArrayBytes).
  static bool Packs(const io::MarkerArray& a);

  /// Packs array `a` (opened as `handle`; `whole` this rank's destination);
  /// collective when that sends the full packet first.
  void Add(size_t handle, const io::MarkerArray& a, const Destination& whole, Status& local);

  /// Collective: reads (rank 0), broadcasts and unpacks the packet.
  void Send(Status& local);

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
std::vector<int64_t> KeyOf(size_t array, const Box& box);

// Collective. Finds which of `mine` (this rank's keys, each once) other
// ranks want too, without gathering every request anywhere: each key goes
// to its home rank (one all-to-all), the home groups identical keys — the
// whole key compared, not its hash — and picks one reader per group of two
// or more ranks, the member it has given the fewest bytes to read so far
// (ties: the first member at or after the home rank), so reads spread over
// the ranks. It replies (a second all-to-all): to each member the reader, to
// the reader the other members. Deterministic: every home walks its groups
// in key order. Returns the keys shared with other ranks, in key order.
std::vector<SharedRead> FindSharedReads(const io::Marker& m, std::vector<SharedRead> mine,
                                        const Comm& comm);

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
                       Status local);

}  // namespace mhckpt::internal
