// A job for tests/lock_test.py: two separate mpirun jobs on one root.
//
//   lock_job hold ROOT STEP   Open ROOT; save STEP and STEP + 1 (a test's
//                             MHCKPT_FAULT may hold the second one mid-write);
//                             restore STEP + 1 and compare every byte.
//   lock_job open ROOT        Open ROOT; restore its newest committed step
//                             and compare every byte.
//
// Rank 0 prints `OPEN <status>` after Open, and `RESULT <status>` at the end.
// Exit status: 0 on success, 3 if Open failed with FAILED_PRECONDITION (the
// root is in use), 1 on any other failure; the same on every rank.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::OpenAgreed;

constexpr int64_t kRows = 256;
const std::vector<int64_t> kShape{kRows, 1024};

Box RowsOf(int size, int rank) {
  auto [b, e] = SplitRange(kRows, size, rank);
  return Box{{b, 0}, {e - b, 1024}};
}

Status SaveStep(CheckpointManager& mgr, int64_t step, int size, int rank) {
  const Box box = RowsOf(size, rank);
  auto data = Fill(DType::kFloat32, kShape, box, static_cast<uint64_t>(step));
  mgr.Save(step, std::vector<ArrayToSave>{{"w", DType::kFloat32, kShape, {{box, data.data()}}}})
      .IgnoreError();
  return mgr.WaitUntilFinished();
}

// Restores `step` whole on every rank and compares it with what was saved.
Status RestoreAndCompare(CheckpointManager& mgr, int64_t step) {
  std::vector<std::byte> out(static_cast<size_t>(kRows) * 1024 * 4);
  MHCKPT_RETURN_IF_ERROR(mgr.Restore(
      step, std::vector<ArrayToRestore>{{"w", DType::kFloat32, {{FullBox(kShape), out.data()}}}}));
  const bool same =
      out == Fill(DType::kFloat32, kShape, FullBox(kShape), static_cast<uint64_t>(step));
  return mgr.Agree(same ? OkStatus()
                        : DataLoss(fmt::format("step {}: restored bytes differ", step)));
}

Status Hold(CheckpointManager& mgr, int64_t step, int size, int rank) {
  MHCKPT_RETURN_IF_ERROR(SaveStep(mgr, step, size, rank));
  MHCKPT_RETURN_IF_ERROR(SaveStep(mgr, step + 1, size, rank));
  return RestoreAndCompare(mgr, step + 1);
}

Status OpenAndRestore(CheckpointManager& mgr) {
  MHCKPT_ASSIGN_OR_RETURN(std::optional<int64_t> latest, mgr.LatestStep());
  if (!latest) return NotFound("no committed step");
  MHCKPT_RETURN_IF_ERROR(RestoreAndCompare(mgr, *latest));
  return mgr.Agree(OkStatus());
}

int Run(int argc, char** argv, int size, int rank) {
  const std::string mode = argc > 2 ? argv[1] : "";
  if ((mode != "hold" || argc != 4) && (mode != "open" || argc != 3)) {
    if (rank == 0) std::fprintf(stderr, "usage: lock_job hold ROOT STEP | open ROOT\n");
    return 1;
  }
  auto opened = OpenAgreed(argv[2]);
  if (rank == 0) std::printf("OPEN %s\n", opened.status().ToString().c_str());
  std::fflush(stdout);
  if (!opened.ok()) return opened.status().code() == StatusCode::kFailedPrecondition ? 3 : 1;
  Status s =
      mode == "hold" ? Hold(**opened, std::atoll(argv[3]), size, rank) : OpenAndRestore(**opened);
  if (rank == 0) std::printf("RESULT %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace mhckpt

int main(int argc, char** argv) { return mhckpt::testing::RunJob(argc, argv, mhckpt::Run); }
