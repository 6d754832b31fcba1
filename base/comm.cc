#include "base/comm.h"

#include "base/gather_rounds.h"

#include <algorithm>
#include <climits>
#include <utility>

namespace mhckpt::internal {
namespace {

// Bytes per MPI call of the byte transfers (broadcasts, point-to-point
// messages): below MPI's int count limit.
constexpr size_t kBytePiece = size_t{1} << 30;

}  // namespace

Comm Comm::Duplicate(MPI_Comm comm) {
  Comm c;
  MPI_Comm_dup(comm, &c.comm_);
  MPI_Comm_rank(c.comm_, &c.rank_);
  MPI_Comm_size(c.comm_, &c.size_);
  return c;
}

Comm::Comm(Comm&& o) noexcept { *this = std::move(o); }

Comm& Comm::operator=(Comm&& o) noexcept {
  std::swap(comm_, o.comm_);
  std::swap(rank_, o.rank_);
  std::swap(size_, o.size_);
  return *this;
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

std::vector<std::string> Comm::GatherBytes(const std::string& mine, int root,
                                           int64_t round_limit) const {
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
  int mine = 0;
  MPI_Scatter(values.data(), 1, MPI_INT, &mine, 1, MPI_INT, root, comm_);
  return mine;
}

std::vector<std::string> Comm::AllGatherBytes(const std::string& mine) const {
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
  Comm c;
  MPI_Comm_split(comm_, color, rank_, &c.comm_);
  MPI_Comm_rank(c.comm_, &c.rank_);
  MPI_Comm_size(c.comm_, &c.size_);
  return c;
}

int Comm::SharedMemoryLeader() const {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int leader = rank_;
  MPI_Allreduce(&rank_, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  return leader;
}

void Comm::BroadcastBytes(std::string* bytes, int root) const {
  unsigned long long n = bytes->size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_);
  bytes->resize(n);
  BroadcastBuffer(bytes->data(), n, root);
}

void Comm::BroadcastBuffer(void* data, size_t bytes, int root) const {
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    MPI_Bcast(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, root,
              comm_);
  }
}

void Comm::BroadcastValues(std::vector<int64_t>* values, int root) const {
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
  AllreduceMaxInPieces(values, MPI_INT, comm_);
}

void Comm::AllreduceMax(std::vector<int64_t>* values) const {
  AllreduceMaxInPieces(values, MPI_INT64_T, comm_);
}

int Comm::AllreduceMax(int value) const {
  int out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_);
  return out;
}

int Comm::AllreduceSum(int value) const {
  int out = 0;
  MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_SUM, comm_);
  return out;
}

void Comm::Barrier() const { MPI_Barrier(comm_); }

std::vector<std::vector<int64_t>> Comm::AllToAllValues(
    const std::vector<std::vector<int64_t>>& to_each) const {
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
  const auto* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    requests->emplace_back();
    MPI_Isend(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, peer, tag,
              comm_, &requests->back());
  }
}

void Comm::PostReceive(void* data, size_t bytes, int peer, int tag,
                       std::vector<MPI_Request>* requests) const {
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kBytePiece) {
    requests->emplace_back();
    MPI_Irecv(p + done, static_cast<int>(std::min(kBytePiece, bytes - done)), MPI_BYTE, peer, tag,
              comm_, &requests->back());
  }
}

void Comm::WaitAll(std::vector<MPI_Request>* requests) {
  MPI_Waitall(static_cast<int>(requests->size()), requests->data(), MPI_STATUSES_IGNORE);
  requests->clear();
}

}  // namespace mhckpt::internal
