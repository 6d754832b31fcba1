// main() for the MPI tests: MPI_Init_thread(MULTIPLE), GoogleTest, one exit
// code for all ranks. Only rank 0 prints GoogleTest's progress; other ranks
// print failures.
#include <mpi.h>

#include <gtest/gtest.h>

#include <cstdio>

namespace {
constexpr int kSkipped = 77;

// On ranks other than 0: print failures only, tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // A filter that matches no test is a registration mistake, not a pass.
  if (::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    if (rank == 0) std::fprintf(stderr, "no test matches the filter\n");
    failed = 1;
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rank == 0 && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  // Every test that ran was skipped (on every rank): kSkipped, which ctest
  // (SKIP_RETURN_CODE, tests/CMakeLists.txt) reports as skipped, not passed.
  const auto& unit = *::testing::UnitTest::GetInstance();
  int skipped_only = unit.successful_test_count() == 0 && unit.skipped_test_count() > 0 ? 1 : 0;
  int all_skipped = 0;
  MPI_Allreduce(&skipped_only, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  if (any) return 1;
  return all_skipped ? kSkipped : 0;
}
