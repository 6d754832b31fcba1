// io/layout.h: the names of step directories.
#include <gtest/gtest.h>

#include "io/layout.h"

namespace mhckpt {
namespace {

TEST(Layout, StepDirNames) {
  EXPECT_EQ(io::StepDirName(42), "step_0000000042");
  EXPECT_EQ(io::ParseStepDirName("step_0000000042"), 42);
  EXPECT_FALSE(io::ParseStepDirName("step_42").has_value());  // one spelling
  EXPECT_FALSE(io::ParseStepDirName("step_00000000x2").has_value());
  EXPECT_FALSE(io::ParseStepDirName("other").has_value());
}

}  // namespace
}  // namespace mhckpt
