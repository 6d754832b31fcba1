#include "coordinator/read_once.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "base/guard.h"
#include "base/log.h"

namespace mhckpt::internal {
namespace {

size_t ArrayBytes(const io::MarkerArray& a) {
  return static_cast<size_t>(Volume(a.shape).value_or(0)) * DTypeSize(a.dtype);
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

// At a home: one rank that sent a key, and the position of the key in what
// that rank sent.
struct Member {
  int rank;
  size_t position;
};
// At a home: the members of each key, sorted by rank.
using KeyGroups = std::map<std::vector<int64_t>, std::vector<Member>>;

// FindSharedReads at the home: the keys received from every rank (`got`)
// grouped, and in `received` how many keys each rank sent.
KeyGroups GroupKeys(const std::vector<std::vector<int64_t>>& got, std::vector<size_t>* received) {
  KeyGroups groups;
  received->assign(got.size(), 0);
  for (size_t r = 0; r < got.size(); ++r) {  // ascending: members come sorted by rank
    const std::vector<int64_t>& words = got[r];
    for (size_t at = 0; at + 2 <= words.size(); ++(*received)[r]) {
      const size_t n = 2 + 2 * static_cast<size_t>(words[at + 1]);
      groups[std::vector<int64_t>(words.begin() + static_cast<ptrdiff_t>(at),
                                  words.begin() + static_cast<ptrdiff_t>(at + n))]
          .push_back({static_cast<int>(r), (*received)[r]});
      at += n;
    }
  }
  return groups;
}

// FindSharedReads at the home: a reader for each group of two or more
// members. The reply to each rank, per key in the order it sent them:
// [reader (-1: nobody else wants it), n, n recipients], flattened.
std::vector<std::vector<int64_t>> ChooseReaders(const io::Marker& m, const KeyGroups& groups,
                                                const std::vector<size_t>& received,
                                                const Comm& comm) {
  const int size = comm.size();
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
  return flat;
}

// Bytes of pinned host memory one round of SharedTransfers lands device
// destinations in (a larger box goes alone).
constexpr size_t kSharedRoundBytes = size_t{256} << 20;
// The tag of every shared-read message; MPI's non-overtaking rule matches
// them, since both sides post them in key order.
constexpr int kSharedReadTag = 14;

}  // namespace

DeviceBroadcaster* DeviceBroadcasts::For(const Comm& comm, int device) {
  if (!tried_) {
    tried_ = true;
    broadcaster_ = DeviceBroadcaster::Create(comm, device, &why_, timeout_seconds_, watchdog_);
    if (!broadcaster_ && comm.rank() == 0) {
      Logger()->info("mhckpt: device broadcasts go through MPI: {}", why_);
    }
  }
  if (!broadcaster_) return nullptr;
  bool moved = comm.AllreduceMax(broadcaster_->device() != device ? 1 : 0) != 0;
  return moved ? nullptr : broadcaster_.get();
}

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

Status ReadAndBroadcastOnDevices(ReadBatch& batch, size_t handle, const io::MarkerArray& a,
                                 const Destination& whole, const Comm& comm,
                                 DeviceBroadcaster& nccl, PinnedBuffer& bounce, Status local) {
  if (comm.rank() == 0 && local.ok()) {
    local = Guarded("restore", [&] {
      Landing land(whole, a.dtype, bounce);  // only the root reads: only it pins memory
      MHCKPT_RETURN_IF_ERROR(batch.Add(handle, a, whole.box, static_cast<std::byte*>(land.host())));
      MHCKPT_RETURN_IF_ERROR(batch.Flush());
      return land.Finish();
    });
  }
  Status sent = nccl.Broadcast(comm, whole.data, BoxBytes(whole.box, a.dtype), 0, whole.stream);
  return local.ok() ? sent : local;
}

bool PacketBroadcast::Packs(const io::MarkerArray& a) { return ArrayBytes(a) <= kMaxArrayBytes; }

void PacketBroadcast::Add(size_t handle, const io::MarkerArray& a, const Destination& whole,
                          Status& local) {
  const size_t bytes = ArrayBytes(a);
  if (bytes_ + bytes > kPacketBytes) Send(local);
  entries_.push_back({handle, &a, &whole, bytes_, bytes});
  bytes_ += bytes;
}

void PacketBroadcast::Send(Status& local) {
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

std::vector<int64_t> KeyOf(size_t array, const Box& box) {
  std::vector<int64_t> key{static_cast<int64_t>(array), static_cast<int64_t>(box.start.size())};
  key.insert(key.end(), box.start.begin(), box.start.end());
  key.insert(key.end(), box.count.begin(), box.count.end());
  return key;
}

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

  std::vector<size_t> received;  // keys received from each rank
  const KeyGroups groups = GroupKeys(got, &received);
  const std::vector<std::vector<int64_t>> back =
      comm.AllToAllValues(ChooseReaders(m, groups, received, comm));

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

}  // namespace mhckpt::internal
