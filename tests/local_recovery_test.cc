// coordinator/local_recovery.h: the record of deleted steps, and the
// election's skipping of the saves they cover (a node away from the job that
// deleted a step still holds it).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/local_recovery.h"

namespace mhckpt::internal {
namespace {

TEST(LocalDeletions, RoundTripAndKeepTheHighestSteps) {
  const Deletions some{{3, 250}, {7, 90}};
  Result<Deletions> back = ParseLocalDeletions(LocalDeletionsToJson(some), "r");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, some);
  // A step twice (a record written by hand): its later time.
  back = ParseLocalDeletions(R"({"deleted": [[3, 100], [3, 250], [7, 90]]})", "r");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, some);

  Deletions many;
  for (int64_t step = 0; step < static_cast<int64_t>(kMaxDeletedSteps) + 10; ++step) {
    many[step] = step * 10;
  }
  back = ParseLocalDeletions(LocalDeletionsToJson(many), "r");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), kMaxDeletedSteps);
  EXPECT_EQ(back->begin()->first, 10);
  EXPECT_EQ(back->rbegin()->first, static_cast<int64_t>(kMaxDeletedSteps) + 9);
}

TEST(LocalDeletions, ADamagedRecordIsDataLossNamingIt) {
  for (const std::string text : {"", "{", "[]", R"({"deleted": [[1]]})", R"({"deleted": 5})",
                                 R"({"deleted": [["a", 1]]})"}) {
    Result<Deletions> r = ParseLocalDeletions(text, "/root/mhckpt.local-deletions");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << text;
    EXPECT_NE(r.status().message().find("/root/mhckpt.local-deletions"), std::string::npos)
        << r.status().ToString();
  }
}

// Two nodes of one rank each; node `holder` holds both files of step 5 saved
// at `created` (world size 2, copies), the other node nothing.
std::vector<std::string> Reports(int holder, int64_t created) {
  const nlohmann::json save = {{"step", 5},
                               {"hash", 42},
                               {"world_size", 2},
                               {"created", created},
                               {"files", {0, 1}},
                               {"blocks", nlohmann::json::array()},
                               {"groups", nlohmann::json::array()}};
  std::vector<std::string> reports(2, "[]");
  reports[static_cast<size_t>(holder)] = nlohmann::json::array({save}).dump();
  return reports;
}

TEST(LocalDeletions, TheElectionSkipsADeletedSaveOnly) {
  const Nodes nodes(std::vector<int64_t>{0, 1});
  const nlohmann::json restorable = ElectRestorable(nodes, Reports(1, 1000), 2, "d");
  ASSERT_EQ(restorable.size(), 1u) << restorable.dump();
  EXPECT_EQ(restorable[0].at("step"), 5);
  EXPECT_EQ(restorable[0].at("source"), 1);

  EXPECT_TRUE(ElectRestorable(nodes, Reports(1, 1000), 2, "d", {{5, 1000}}).empty());
  EXPECT_TRUE(ElectRestorable(nodes, Reports(1, 1000), 2, "d", {{5, 1500}}).empty());
  // A save of the same step number made after the deletion is restored.
  EXPECT_EQ(ElectRestorable(nodes, Reports(1, 2000), 2, "d", {{5, 1500}}).size(), 1u);
  EXPECT_EQ(ElectRestorable(nodes, Reports(1, 1000), 2, "d", {{4, 1500}}).size(), 1u);
}

}  // namespace
}  // namespace mhckpt::internal
