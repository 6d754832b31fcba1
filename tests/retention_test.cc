// coordinator/retention.h: which steps max_to_keep and keep_period delete.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "coordinator/retention.h"

namespace mhckpt::internal {
namespace {

TEST(Retention, KeepsNewestAndPeriodSteps) {
  std::vector<int64_t> steps{0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(StepsToDelete(steps, 0, 0), std::vector<int64_t>{});
  EXPECT_EQ(StepsToDelete(steps, 2, 0), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(StepsToDelete(steps, 2, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(StepsToDelete({5}, 1, 0), std::vector<int64_t>{});
}

}  // namespace
}  // namespace mhckpt::internal
