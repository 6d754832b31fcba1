// A narrow seam over MPI: a move-only communicator owning its own duplicate,
// with typed helpers for the few collective patterns mhckpt uses. It lives in
// base/ so that both io/ and coordinator/ move bytes between ranks through
// it, never through raw MPI calls; MPI types still appear where a library
// needs them: the MPI-IO file access of parallel HDF5 (H5Pset_fapl_mpio)
// takes get(), the one accessor of the MPI handle.
//
// Serial(): a communicator of one process that makes no MPI call at all
// (MPI need not be initialised), with every collective's one-rank result, so
// that protocol code written against Comm runs in a plain unit test without
// mpiexec.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/gather_rounds.h"

namespace mhckpt::internal {

class Comm {
 public:
  /// Duplicates `comm` (collective), so that mhckpt traffic never matches the
  /// caller's messages and the I/O thread can run beside the training loop.
  static Comm Duplicate(MPI_Comm comm);
  /// One process, world size 1, no MPI calls: each collective is what it
  /// is at one rank; a message to rank 0 is this process's own (PostSend
  /// and PostReceive of one tag meet in the order they were posted).
  static Comm Serial();
  /// Whether MPI was initialised with MPI_THREAD_MULTIPLE (what an I/O
  /// thread beside the caller's needs).
  [[nodiscard]] static bool ThreadMultiple();

  Comm() = default;
  Comm(Comm&& o) noexcept;
  Comm& operator=(Comm&& o) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();  ///< MPI_Comm_free (collective in the standard; local in practice)

  /// The MPI handle, for APIs that take one (HDF5's MPI-IO file access);
  /// MPI_COMM_NULL for Serial(). Nothing else in mhckpt calls MPI with it.
  [[nodiscard]] MPI_Comm get() const { return comm_; }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  /// Whether this is Serial().
  [[nodiscard]] bool serial() const { return serial_ != nullptr; }
  /// Names this communicator within the process (never reused, kept by
  /// moves, new for each Duplicate, Split and Serial): whether a state made
  /// for one communicator is used with another.
  [[nodiscard]] uint64_t id() const { return id_; }

  /// Every rank's bytes at `root` (empty vector elsewhere), of any size: in
  /// rounds of at most `round_limit` bytes at the root (gather_rounds.h).
  [[nodiscard]] std::vector<std::string> GatherBytes(const std::string& mine, int root,
                                                     int64_t round_limit = kGatherRoundBytes) const;
  /// Every rank's bytes on every rank (index = rank): GatherBytes to rank 0,
  /// then one broadcast of them all.
  [[nodiscard]] std::vector<std::string> AllGatherBytes(const std::string& mine) const;
  /// The lowest rank of this communicator that shares memory with this one
  /// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED: in practice, the node).
  [[nodiscard]] int SharedMemoryLeader() const;
  /// Collective: the ranks of this communicator with the same `color`, in
  /// the order of their ranks here (MPI_Comm_split).
  [[nodiscard]] Comm Split(int color) const;
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
  /// Whether `value` is true on every rank (logical and).
  [[nodiscard]] bool AllreduceAnd(bool value) const;
  /// Posts an element-wise minimum over ranks of `values[0..n)`, in place
  /// (MPI_Iallreduce), appending its request to `*requests`: the values are
  /// the minimum once WaitAll has returned, and must stay put until then.
  /// Every rank posts its rounds in the same order. Serial(): nothing posted
  /// (the values are already the minimum).
  void PostAllreduceMin(int64_t* values, int n, std::vector<MPI_Request>* requests) const;
  void Barrier() const;
  /// Ends the whole job with `code` (MPI_Abort; Serial(): this process).
  [[noreturn]] void Abort(int code) const;

  /// Personalized all-to-all: `to_each[r]` goes to rank r (to_each.size() ==
  /// size()); returns what each rank sent here, indexed by rank. One
  /// MPI_Alltoall of the counts, one MPI_Alltoallv of the values. What one
  /// rank sends or receives in all must stay below 2^31 values (int counts
  /// and displacements): restore's keys are a few words per destination.
  [[nodiscard]] std::vector<std::vector<int64_t>> AllToAllValues(
      const std::vector<std::vector<int64_t>>& to_each) const;

  /// Posts the send of `bytes` at `data` to `peer` with `tag` (MPI_Isend), in
  /// pieces below MPI's int count limit, appending their requests to
  /// `*requests`. A matching PostReceive of the same length at `peer` takes
  /// the pieces in order (MPI does not let messages of one tag between two
  /// ranks overtake each other).
  void PostSend(const void* data, size_t bytes, int peer, int tag,
                std::vector<MPI_Request>* requests) const;
  /// The receiving side of PostSend (MPI_Irecv of the same pieces).
  void PostReceive(void* data, size_t bytes, int peer, int tag,
                   std::vector<MPI_Request>* requests) const;
  /// Waits for every request and clears the list.
  static void WaitAll(std::vector<MPI_Request>* requests);

 private:
  struct SerialState;  // Serial(): the posted messages to self not yet met

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  uint64_t id_ = 0;
  std::shared_ptr<SerialState> serial_;  // shared_ptr: complete only in comm.cc
};

}  // namespace mhckpt::internal
