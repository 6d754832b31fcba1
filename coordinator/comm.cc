#include "coordinator/comm.h"

#include <algorithm>
#include <climits>
#include <utility>

namespace mhckpt::internal {

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

std::vector<std::string> Comm::GatherBytes(const std::string& mine, int root) const {
  // Descriptions are far below 2 GiB per rank; the int counts of MPI suffice.
  int n = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == root ? size_ : 0);
  MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, comm_);
  std::vector<int> displs(sizes.size());
  std::string all;
  if (rank_ == root) {
    long long total = 0;
    for (size_t r = 0; r < sizes.size(); ++r) {
      displs[r] = static_cast<int>(total);
      total += sizes[r];
    }
    all.resize(static_cast<size_t>(total));
  }
  MPI_Gatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, root,
              comm_);
  std::vector<std::string> out;
  for (size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(displs[r], sizes[r]));
  return out;
}

void Comm::BroadcastBytes(std::string* bytes, int root) const {
  unsigned long long n = bytes->size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_);
  bytes->resize(n);
  BroadcastBuffer(bytes->data(), n, root);
}

void Comm::BroadcastBuffer(void* data, size_t bytes, int root) const {
  constexpr size_t kPiece = size_t{1} << 30;
  auto* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kPiece) {
    MPI_Bcast(p + done, static_cast<int>(std::min(kPiece, bytes - done)), MPI_BYTE, root, comm_);
  }
}

void Comm::BroadcastValues(std::vector<int64_t>* values, int root) const {
  unsigned long long n = values->size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, comm_);
  values->resize(n);
  BroadcastBuffer(values->data(), n * sizeof(int64_t), root);
}

void Comm::AllreduceMax(std::vector<int>* values) const {
  MPI_Allreduce(MPI_IN_PLACE, values->data(), static_cast<int>(values->size()), MPI_INT, MPI_MAX,
                comm_);
}

void Comm::AllreduceMax(std::vector<int64_t>* values) const {
  MPI_Allreduce(MPI_IN_PLACE, values->data(), static_cast<int>(values->size()), MPI_INT64_T,
                MPI_MAX, comm_);
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

}  // namespace mhckpt::internal
