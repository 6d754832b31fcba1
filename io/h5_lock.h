// One lock for every HDF5 call of the process. Debian's HDF5 is built
// without its thread-safety option, so two threads must never be inside
// HDF5 at once — and a process may hold several CheckpointManagers, each
// with an I/O thread of its own. Every HDF5 call sequence (io/h5_file.cc is
// the one file that calls HDF5) runs under this lock.
//
// Two ways to hold it:
//
// - H5LocalGuard, for sequences that wait for no other process: rank 0's
//   layout of the direct engine (HDF5's POSIX driver), a dataset's close,
//   a type's creation. It blocks until the lock is free, and is recursive:
//   a thread that already holds the lock passes at once.
//
// - H5CollectiveHold, for the life of a file opened with MPI-IO (the HDF5
//   engine's files, written or read): H5Fcreate, H5Fopen, H5Dcreate and
//   H5Dopen with collective metadata, collective H5Dwrite, H5Fflush and
//   H5Fclose wait until every rank of the communicator has entered them.
//
// Why a collective call may not simply take a blocking lock: take a process
// with two managers, A on communicator a and B on communicator b, both
// spanning processes 0 and 1. Process 0's A thread takes the lock and enters
// H5Fcreate(a), which waits for process 1's A thread; that one waits for the
// lock, which process 1's B thread holds inside H5Fcreate(b), which waits
// for process 0's B thread, which waits for the lock: a cycle, a hang. A
// blocking lock across collectives is safe only if every process takes it
// for the managers' collectives in one global order, and nothing orders two
// managers' I/O threads.
//
// So a collective hold is taken by every rank of the communicator together,
// or by none, and nobody blocks while holding the lock for someone who waits
// for it:
//   1. Barrier on the communicator: every rank of it has arrived, so none of
//      its threads is stuck in an H5LocalGuard wait (they are all here).
//   2. Each rank try-locks (never blocks) and an allreduce (MPI_LAND) says
//      whether every rank got the lock. While a rank waits in it holding the
//      lock, every other rank of the communicator is past step 1 and only
//      try-locks on its way: the wait is short and ends.
//   3. All got it: the hold is taken on every rank; the collective sequence
//      that follows waits only for ranks that hold it too. Otherwise every
//      rank that got the lock lets it go, each sleeps a random while (which
//      grows with each try, up to 50 ms) and they start again at step 1.
// A holder never waits for a thread that waits for the lock: holders wait
// only for each other (the collective calls of their communicator), local
// guards wait for holders, and a hold that is being tried is let go. Two
// communicators that contend keep retrying only while they collide; the
// random backoff separates them.
//
// Nested holds on one thread (recursive) do not run the protocol again: the
// outer hold is already taken on every rank of the communicator. A
// collective hold needs MPI_THREAD_MULTIPLE when other threads use MPI (as
// the I/O threads do).
#pragma once

#include "base/comm.h"

namespace mhckpt::io {

/// Blocks until this thread holds the process's HDF5 lock; for HDF5 calls
/// that wait for no other process. Recursive.
class H5LocalGuard {
 public:
  H5LocalGuard();
  ~H5LocalGuard();
  H5LocalGuard(const H5LocalGuard&) = delete;
  H5LocalGuard& operator=(const H5LocalGuard&) = delete;
};

/// Collective over `comm`: holds the process's HDF5 lock on every rank of
/// `comm` together (the protocol above), until destroyed or Release().
/// Move-only; an empty hold (default-constructed or moved from) holds nothing.
class H5CollectiveHold {
 public:
  H5CollectiveHold() = default;
  static H5CollectiveHold Acquire(const internal::Comm& comm);
  H5CollectiveHold(H5CollectiveHold&& o) noexcept;
  H5CollectiveHold& operator=(H5CollectiveHold&& o) noexcept;
  H5CollectiveHold(const H5CollectiveHold&) = delete;
  H5CollectiveHold& operator=(const H5CollectiveHold&) = delete;
  ~H5CollectiveHold();
  /// Lets the lock go (local; the other ranks let theirs go on their own).
  void Release();

 private:
  bool held_ = false;
};

/// Whether this thread holds the lock (either way).
bool H5LockHeldByThisThread();

/// Collective holds that had to try again (for tests).
unsigned long H5CollectiveRetries();

}  // namespace mhckpt::io
