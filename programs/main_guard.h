// What the programs (cli/, demo/, bench/) share: the last resort of main().
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>

namespace mhckpt {

/// Returns `body()`. An exception escaping it (bad_alloc, a bug) is reported
/// as "`program`: unexpected exception: ..." and, while MPI is initialised,
/// aborts the job rather than leave the other ranks waiting for this one;
/// the result is then 1.
template <typename Body>
int GuardedMain(const char* program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected exception: %s\n", program, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: unexpected exception\n", program);
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace mhckpt
