// io/dataset_layout.h: layout replay writes HDF5's private metadata bytes, so
// it runs only with the HDF5 release it was written for (1.10.8).
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "io/dataset_layout.h"
#include "io/h5_file.h"

namespace mhckpt::io {
namespace {

TEST(LayoutReplayGuard, AcceptsOnlyTheReleaseItWasWrittenFor) {
  static_assert(LayoutReplayFitsHdf5(1, 10, 8));
  EXPECT_TRUE(LayoutReplayFitsHdf5(1, 10, 8));
  for (const auto& [major, minor, release] :
       {std::tuple{1u, 10u, 7u}, std::tuple{1u, 10u, 9u}, std::tuple{1u, 12u, 1u},
        std::tuple{1u, 14u, 3u}, std::tuple{1u, 8u, 22u}, std::tuple{2u, 0u, 0u},
        std::tuple{0u, 0u, 0u}, std::tuple{1u, 11u, 8u}}) {
    EXPECT_FALSE(LayoutReplayFitsHdf5(major, minor, release))
        << major << "." << minor << "." << release;
  }
}

// Here the answer is the pure check applied to the HDF5 loaded (this build
// is compiled against the one it loads), and a refusal says why.
TEST(LayoutReplayGuard, EnabledExactlyWithTheReleaseLoaded) {
  const H5Version v = H5LibraryVersion();
  EXPECT_GT(v.major + v.minor, 0u) << "H5get_libversion failed";
  std::string why = "unset";
  const bool enabled = LayoutReplayEnabled(&why);
  EXPECT_EQ(enabled, LayoutReplayFitsHdf5(v.major, v.minor, v.release));
  if (enabled) {
    EXPECT_EQ(why, "");
  } else {
    EXPECT_NE(why.find("replay is written for 1.10.8"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace mhckpt::io
