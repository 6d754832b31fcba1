// Helpers shared by the MPI tests: a fresh directory per test, deterministic
// array contents keyed by global index, and checks across ranks.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "coordinator/checkpoint_manager.h"
#include "worker/array.h"

namespace mhckpt::testing {

int Rank(MPI_Comm comm = MPI_COMM_WORLD);
int Size(MPI_Comm comm = MPI_COMM_WORLD);

/// Collective: an empty directory for the running test (rank 0 wipes it).
/// Removed when the test ends without a failure on any rank, kept when it
/// fails or when MHCKPT_KEEP_TEST_DATA=1.
std::string FreshDir(const std::string& suffix = "");

/// The bytes of every element of `box` of a global array, row-major. Element
/// bytes are a hash of (seed, global linear index), so any box of any
/// sharding can be predicted. Bools hold 0 or 1.
std::vector<std::byte> Fill(DType dtype, const std::vector<int64_t>& shape, const Box& box,
                            uint64_t seed);

/// Collective: CheckpointManager::Open, then an agreement on its outcome, so
/// that a failure on any rank is an error on every rank (no rank goes on into
/// a collective that another rank skipped).
Result<std::unique_ptr<CheckpointManager>> OpenAgreed(const std::string& dir,
                                                      const Options& options = {},
                                                      MPI_Comm comm = MPI_COMM_WORLD);

/// Collective, for GoogleTest bodies: OpenAgreed over MPI_COMM_WORLD; on
/// failure records it (with the Status) on every rank and returns null, so
///   auto mgr = OpenForTest(dir);
///   ASSERT_TRUE(mgr);
/// stops the test on every rank alike.
std::unique_ptr<CheckpointManager> OpenForTest(const std::string& dir, const Options& options = {});

/// Collective: true if `s` is the same Status on every rank.
bool SameOnAllRanks(const Status& s, MPI_Comm comm = MPI_COMM_WORLD);

/// Collective: rank 0 rewrites the commit marker of `step` under `dir` with
/// every array's file offset -1 (as an engine without offsets writes it),
/// so that restore and verify read it through HDF5. False on every rank if
/// rank 0 failed.
bool ForgetOffsets(const std::string& dir, int64_t step);

/// Collective: the sum of `v` over ranks.
uint64_t SumOverRanks(uint64_t v, MPI_Comm comm = MPI_COMM_WORLD);

/// The main of a test job run under mpiexec (crash_job, reshard_test, ...):
/// MPI_Init_thread(MPI_THREAD_MULTIPLE), `body(argc, argv, size, rank)`, then
/// the largest exit code over the ranks (so every rank exits alike) and
/// MPI_Finalize.
int RunJob(int argc, char** argv,
           const std::function<int(int argc, char** argv, int size, int rank)>& body);

}  // namespace mhckpt::testing
