#include "base/comm.h"

#include "base/gather_rounds.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

namespace mhckpt::internal {
namespace {

// Bytes per MPI call of the byte transfers (broadcasts, point-to-point
// messages): below MPI's int count limit.
constexpr size_t kBytePiece = size_t{1} << 30;

std::atomic<uint64_t> g_next_id{1};

}  // namespace

// Serial(): messages to self, each side posted before the other or after.
struct Comm::SerialState {
  struct Post {
    int tag = 0;
    const char* src = nullptr;  // a send's bytes
    char* dst = nullptr;        // a receive's buffer
    size_t bytes = 0;
  };
  std::mutex mu;
  std::deque<Post> sends, receives;  // not yet met, in the order posted

  // Meets `post` with the first of `other` of its tag, or keeps it in `mine`.
  static void Meet(Post post, bool is_send, std::deque<Post>& other, std::deque<Post>& mine) {
    for (auto it = other.begin(); it != other.end(); ++it) {
      if (it->tag != post.tag) continue;
      const Post& send = is_send ? post : *it;
      const Post& receive = is_send ? *it : post;
      std::memcpy(receive.dst, send.src, std::min(send.bytes, receive.bytes));
      other.erase(it);
      return;
    }
    mine.push_back(post);
  }
};

Comm Comm::Duplicate(MPI_Comm comm) {
  Comm c;
  MPI_Comm_dup(comm, &c.comm_);
  MPI_Comm_rank(c.comm_, &c.rank_);
  MPI_Comm_size(c.comm_, &c.size_);
  c.id_ = g_next_id.fetch_add(1, std::memory_order_relaxed);
  return c;
}

Comm Comm::Serial() {
  Comm c;
  c.serial_ = std::make_shared<SerialState>();
  c.id_ = g_next_id.fetch_add(1, std::memory_order_relaxed);
  return c;
}

Comm::Comm(Comm&& o) noexcept { *this = std::move(o); }

Comm& Comm::operator=(Comm&& o) noexcept {
  std::swap(comm_, o.comm_);
  std::swap(rank_, o.rank_);
  std::swap(size_, o.size_);
  std::swap(id_, o.id_);
  std::swap(serial_, o.serial_);
  return *this;
}

Comm::~Comm() {
  if (comm_ == MPI_COMM_NULL) return;  // Serial() or moved from: no MPI call
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

std::vector<std::string> Comm::GatherBytes(const std::string& mine, int root,
                                           int64_t round_limit) const {
  if (serial()) return {mine};
  // Sizes as 64-bit values; the bytes in rounds whose int counts and
  // displacements cannot overflow (base/gather_rounds.h).
  int64_t n = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(rank_ == root ? size_ : 0);
  MPI_Gather(&n, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, root, comm_);
  GatherRounds rounds;
  if (rank_ == root) rounds = PlanGatherRounds(sizes, round_limit);
  int64_t shape[2] = {rounds.piece, rounds.rounds};
  MPI_Bcast(shape, 2, MPI_INT64_T, root, comm_);
  rounds = {shape[0], shape[1]};
  std::vector<std::string> out(sizes.size());
  for (size_t r = 0; r < out.size(); ++r) out[r].resize(static_cast<size_t>(sizes[r]));
  std::string buffer;
  for (int64_t k = 0; k < rounds.rounds; ++k) {
    auto [offset, count] = GatherPiece(n, rounds, k);
    GatherLayout layout;
    if (rank_ == root) {
      layout = *GatherRoundLayout(sizes, rounds, k);  // fits: PlanGatherRounds bounds it
      buffer.resize(static_cast<size_t>(layout.total));
    }
    MPI_Gatherv(mine.data() + offset, static_cast<int>(count), MPI_BYTE, buffer.data(),
                layout.counts.data(), layout.displs.data(), MPI_BYTE, root, comm_);
    for (size_t r = 0; r < out.size(); ++r) {
      const int64_t at = GatherPiece(sizes[r], rounds, k).first;
      std::copy_n(buffer.data() + layout.displs[r], layout.counts[r], out[r].data() + at);
    }
  }
  return out;
}

int Comm::ScatterInt(const std::vector<int>& values, int root) const {
  if (serial()) return values.at(0);
  int mine = 0;
  MPI_Scatter(values.data(), 1, MPI_INT, &mine, 1, MPI_INT, root, comm_);
  return mine;
}

std::vector<std::string> Comm::AllGatherBytes(const std::string& mine) const {
  if (serial()) return {mine};
  std::vector<std::string> all = GatherBytes(mine, 0);
  std::vector<int64_t> sizes(static_cast<size_t>(size_));
  std::string joined;
  if (rank_ == 0) {
    for (size_t r = 0; r < all.size(); ++r) {
      sizes[r] = static_cast<int64_t>(all[r].size());
      joined += all[r];
    }
  }
  BroadcastValues(&sizes, 0);
  BroadcastBytes(&joined, 0);
  all.assign(static_cast<size_t>(size_), std::string());
  size_t at = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto n = static_cast<size_t>(sizes[r]);
    all[r] = joined.substr(at, n);
    at += n;
  }
  return all;
}

Comm Comm::Split(int color) const {
  if (serial()) return Serial();
  Comm c;
  MPI_Comm_split(comm_, color, rank_, &c.comm_);
  MPI_Comm_rank(c.comm_, &c.rank_);
  MPI_Comm_size(c.comm_, &c.size_);
  c.id_ = g_next_id.fetch_add(1, std::memory_order_relaxed);
  return c;
}

int Comm::SharedMemoryLeader() const {
  if (serial()) return 0;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int leader = rank_;
  MPI_Allreduce(&rank_, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  return leader;
}

void Comm::BroadcastBytes(std::string* bytes, int root) const {
  if (serial()) return;
  unsigned long long n = bytes->size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_);
  bytes->resize(n);
  BroadcastBuffer(bytes->data(), n, root);
}

void Comm::BroadcastBuffer(void* data, size_t bytes, int root) const {
  if (serial()) return;
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    MPI_Bcast(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, root,
              comm_);
  }
}

void Comm::BroadcastValues(std::vector<int64_t>* values, int root) const {
  if (serial()) return;
  unsigned long long n = values->size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_);
  values->resize(n);
  BroadcastBuffer(values->data(), n * sizeof(int64_t), root);
}

namespace {

// In pieces below MPI's int count limit (a vector per array may be long).
template <typename T>
void AllreduceMaxInPieces(std::vector<T>* values, MPI_Datatype type, MPI_Comm comm) {
  constexpr size_t kPiece = size_t{1} << 28;
  for (size_t done = 0; done < values->size(); done += kPiece) {
    MPI_Allreduce(MPI_IN_PLACE, values->data() + done,
                  static_cast<int>(std::min(kPiece, values->size() - done)), type, MPI_MAX, comm);
  }
}

}  // namespace

void Comm::AllreduceMax(std::vector<int>* values) const {
  if (serial()) return;
  AllreduceMaxInPieces(values, MPI_INT, comm_);
}

void Comm::AllreduceMax(std::vector<int64_t>* values) const {
  if (serial()) return;
  AllreduceMaxInPieces(values, MPI_INT64_T, comm_);
}

int Comm::AllreduceMax(int value) const {
  if (serial()) return value;
  int out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_);
  return out;
}

int Comm::AllreduceSum(int value) const {
  if (serial()) return value;
  int out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_SUM, comm_);
  return out;
}

bool Comm::AllreduceAnd(bool value) const {
  if (serial()) return value;
  int mine = value ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, comm_);
  return all != 0;
}

void Comm::PostAllreduceMin(int64_t* values, int n, std::vector<MPI_Request>* requests) const {
  if (serial()) return;
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, values, n, MPI_INT64_T, MPI_MIN, comm_, &r);
  requests->push_back(r);
}

void Comm::Barrier() const {
  if (!serial()) MPI_Barrier(comm_);
}

bool Comm::ThreadMultiple() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

void Comm::Abort(int code) const {
  if (serial()) std::_Exit(code);
  MPI_Abort(comm_, code);
  std::_Exit(code);  // MPI_Abort does not return; should it, the process ends anyway
}

std::vector<std::vector<int64_t>> Comm::AllToAllValues(
    const std::vector<std::vector<int64_t>>& to_each) const {
  if (serial()) return {to_each.at(0)};
  std::vector<int> send_counts(size_), recv_counts(size_), send_displs(size_), recv_displs(size_);
  std::vector<int64_t> send;
  for (int r = 0; r < size_; ++r) {
    send_displs[r] = static_cast<int>(send.size());
    send_counts[r] = static_cast<int>(to_each[r].size());
    send.insert(send.end(), to_each[r].begin(), to_each[r].end());
  }
  MPI_Alltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, comm_);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    recv_displs[r] = total;
    total += recv_counts[r];
  }
  std::vector<int64_t> recv(static_cast<size_t>(total));
  MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_INT64_T, recv.data(),
                recv_counts.data(), recv_displs.data(), MPI_INT64_T, comm_);
  std::vector<std::vector<int64_t>> out(size_);
  for (int r = 0; r < size_; ++r) {
    out[r].assign(recv.begin() + recv_displs[r], recv.begin() + recv_displs[r] + recv_counts[r]);
  }
  return out;
}

void Comm::PostSend(const void* data, size_t bytes, int peer, int tag,
                    std::vector<MPI_Request>* requests) const {
  if (serial()) {  // to self: nothing to wait for
    std::lock_guard<std::mutex> lock(serial_->mu);
    SerialState::Meet({tag, static_cast<const char*>(data), nullptr, bytes}, true,
                      serial_->receives, serial_->sends);
    return;
  }
  const auto* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    requests->emplace_back();
    MPI_Isend(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, peer, tag,
              comm_, &requests->back());
  }
}

void Comm::PostReceive(void* data, size_t bytes, int peer, int tag,
                       std::vector<MPI_Request>* requests) const {
  if (serial()) {
    std::lock_guard<std::mutex> lock(serial_->mu);
    SerialState::Meet({tag, nullptr, static_cast<char*>(data), bytes}, false, serial_->sends,
                      serial_->receives);
    return;
  }
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    requests->emplace_back();
    MPI_Irecv(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, peer, tag,
              comm_, &requests->back());
  }
}

void Comm::WaitAll(std::vector<MPI_Request>* requests) {
  if (requests->empty()) return;  // Serial() posts none
  MPI_Waitall(static_cast<int>(requests->size()), requests->data(), MPI_STATUSES_IGNORE);
  requests->clear();
}

}  // namespace mhckpt::internal
