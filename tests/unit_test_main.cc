// main() for the unit tests (no MPI): GoogleTest, and exit 77 when every test
// that ran was skipped, which ctest (SKIP_RETURN_CODE, tests/CMakeLists.txt)
// reports as skipped, not passed. A failure is exit 1 whatever else skipped.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (RUN_ALL_TESTS() != 0) return 1;
  const auto& unit = *::testing::UnitTest::GetInstance();
  constexpr int kSkipped = 77;
  return unit.successful_test_count() == 0 && unit.skipped_test_count() > 0 ? kSkipped : 0;
}
