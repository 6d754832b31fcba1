// main() for the unit tests (no MPI): GoogleTest, and exit 77 when every test
// that ran was skipped, which ctest (SKIP_RETURN_CODE, tests/CMakeLists.txt)
// reports as skipped, not passed. A failure is exit 1 whatever else skipped,
// and so is a filter that matches no test (a registration mistake).
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (RUN_ALL_TESTS() != 0) return 1;
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (unit.test_to_run_count() == 0) {
    std::fprintf(stderr, "no test matches the filter\n");
    return 1;
  }
  constexpr int kSkipped = 77;
  return unit.successful_test_count() == 0 && unit.skipped_test_count() > 0 ? kSkipped : 0;
}
