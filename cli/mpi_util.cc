#include "cli/mpi_util.h"

#include <cstdint>
#include <numeric>

namespace mhckpt::cli {

void BroadcastString(std::string* s, int root, MPI_Comm comm) {
  uint64_t n = s->size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, root, comm);
  s->resize(n);
  MPI_Bcast(s->data(), static_cast<int>(n), MPI_CHAR, root, comm);
}

std::vector<std::string> GatherStrings(const std::vector<std::string>& mine, int root,
                                       MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // One buffer per rank: each string followed by a NUL.
  std::string packed;
  for (const std::string& s : mine) packed.append(s).push_back('\0');
  int length = static_cast<int>(packed.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm);
  std::string all;
  if (rank == root) {
    std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), 0);
    all.resize(static_cast<size_t>(offsets.back()) + static_cast<size_t>(lengths.back()));
  }
  MPI_Gatherv(packed.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              root, comm);
  std::vector<std::string> out;
  for (size_t begin = 0; begin < all.size();) {
    size_t end = all.find('\0', begin);
    out.push_back(all.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

Status BroadcastStatus(const Status& s, int root, MPI_Comm comm) {
  std::string bytes = s.Serialize();
  BroadcastString(&bytes, root, comm);
  return Status::Deserialize(bytes);
}

}  // namespace mhckpt::cli
