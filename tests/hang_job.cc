// A job in which one rank gets stuck (MHCKPT_FAULT="...,action=hang"). The
// others must not wait forever: the watchdog aborts the job within the
// timeout, naming the phase. ctest passes when that message appears
// (tests/CMakeLists.txt, label fault); reaching the end of main is a failure.
#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string dir = argc > 1 ? argv[1] : "/tmp/mhckpt-hang";
  if (rank == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  mhckpt::Options options;
  options.collective_timeout_seconds = 3;
  auto opened = mhckpt::testing::OpenAgreed(dir, options);
  if (!opened.ok()) {  // the same on every rank: all leave, none waits
    std::printf("rank %d: %s\n", rank, opened.status().ToString().c_str());
    MPI_Finalize();
    return 1;
  }
  auto mgr = std::move(opened).value();
  std::vector<float> w(1024, 1.0f);
  std::vector<mhckpt::ArrayToSave> arrays{
      {"w", mhckpt::DType::kFloat32, {1024}, {{mhckpt::FullBox({1024}), w.data()}}}};
  mgr->Save(1, arrays).IgnoreError();
  mhckpt::Status s = mgr->WaitUntilFinished();
  std::printf("rank %d: the save returned (%s) instead of the watchdog aborting\n", rank,
              s.ToString().c_str());
  MPI_Finalize();
  return 1;
}
