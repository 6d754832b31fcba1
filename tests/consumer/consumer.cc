// A user's program against an installed mhckpt: every rank saves its rows of
// a small int32 array and a replicated scalar, then restores the array with
// the rows dealt the other way round and checks every element.
//
//   mpiexec -n N consumer DIR
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "coordinator/checkpoint_manager.h"

namespace {

int32_t Value(int64_t row, int64_t col) { return static_cast<int32_t>(row * 1000 + col); }

int Fail(const char* what, const mhckpt::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

// Runs the check; every Status mhckpt returns is the same on every rank, so
// every rank leaves at the same point.
int Run(const char* dir, int rank, int size) {
  auto opened = mhckpt::CheckpointManager::Open(MPI_COMM_WORLD, dir);
  if (!opened.ok()) return Fail("open", opened.status());
  mhckpt::CheckpointManager& mgr = **opened;

  const int64_t rows = 7 * size + 3, cols = 5;
  auto [b, e] = mhckpt::SplitRange(rows, size, rank);
  std::vector<int32_t> mine;
  for (int64_t i = b; i < e; ++i) {
    for (int64_t j = 0; j < cols; ++j) mine.push_back(Value(i, j));
  }
  int64_t step = 3;
  const mhckpt::Box my_rows{{b, 0}, {e - b, cols}};
  std::vector<mhckpt::ArrayToSave> save = {
      {"w", mhckpt::DType::kInt32, {rows, cols}, {{my_rows, mine.data()}}},
      {"step", mhckpt::DType::kInt64, {}, {{mhckpt::Box{}, &step}}}};
  mhckpt::Status s = mgr.Save(step, save);
  if (s.ok()) s = mgr.WaitUntilFinished();
  if (!s.ok()) return Fail("save", s);

  auto [rb, re] = mhckpt::SplitRange(rows, size, size - 1 - rank);
  std::vector<int32_t> back(static_cast<size_t>((re - rb) * cols), -1);
  int64_t restored_step = -1;
  std::vector<mhckpt::ArrayToRestore> want = {
      {"w", mhckpt::DType::kInt32, {{mhckpt::Box{{rb, 0}, {re - rb, cols}}, back.data()}}},
      {"step", mhckpt::DType::kInt64, {{mhckpt::Box{}, &restored_step}}}};
  s = mgr.Restore(step, want);
  if (!s.ok()) return Fail("restore", s);

  int wrong = restored_step == step ? 0 : 1;
  for (int64_t i = rb; i < re; ++i) {
    for (int64_t j = 0; j < cols; ++j) wrong += back[(i - rb) * cols + j] != Value(i, j) ? 1 : 0;
  }
  if (wrong) std::fprintf(stderr, "rank %d: %d values differ\n", rank, wrong);
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rc = argc == 2 ? Run(argv[1], rank, size) : 2;
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst == 0) std::printf("consumer: saved and restored at %d ranks\n", size);
  MPI_Finalize();
  return worst;
}
