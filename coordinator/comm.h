// A narrow seam over MPI: a move-only communicator owning its own duplicate,
// with typed helpers for the few collective patterns mhckpt uses. mpi.h is
// included by the coordinator and io layers only.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/gather_rounds.h"

namespace mhckpt::internal {

class Comm {
 public:
  /// Duplicates `comm` (collective), so that mhckpt traffic never matches the
  /// caller's messages and the I/O thread can run beside the training loop.
  static Comm Duplicate(MPI_Comm comm);

  Comm() = default;
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();  ///< MPI_Comm_free (collective in the standard; local in practice)

  [[nodiscard]] MPI_Comm get() const { return comm_; }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

  /// Every rank's bytes at `root` (empty vector elsewhere), of any size: in
  /// rounds of at most `round_limit` bytes at the root (gather_rounds.h).
  [[nodiscard]] std::vector<std::string> GatherBytes(const std::string& mine, int root,
                                                     int64_t round_limit = kGatherRoundBytes) const;
  /// Each rank's entry of `values` (significant at `root` only, index = rank).
  [[nodiscard]] int ScatterInt(const std::vector<int>& values, int root) const;
  /// `root`'s bytes everywhere.
  void BroadcastBytes(std::string* bytes, int root) const;
  /// Broadcasts a buffer of any size (in pieces below MPI's int count limit).
  void BroadcastBuffer(void* data, size_t bytes, int root) const;
  /// `root`'s values everywhere (resized to match).
  void BroadcastValues(std::vector<int64_t>* values, int root) const;
  /// Element-wise maximum over ranks, in place (any length).
  void AllreduceMax(std::vector<int>* values) const;
  void AllreduceMax(std::vector<int64_t>* values) const;
  [[nodiscard]] int AllreduceMax(int value) const;
  [[nodiscard]] int AllreduceSum(int value) const;
  void Barrier() const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace mhckpt::internal
