// The library logs through its own logger (base/log.h), or the one the
// caller sets with SetLogger, never through spdlog's default logger, which
// belongs to the application.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using ::testing::Contains;
using testing::Fill;
using testing::FreshDir;
using ::testing::HasSubstr;
using testing::OpenForTest;
using testing::Rank;

// Saves steps 1 and 2 of one small replicated array.
void SaveTwoSteps(CheckpointManager& mgr) {
  for (int64_t step : {1, 2}) {
    std::vector<std::byte> bytes = Fill(DType::kFloat32, {8}, FullBox({8}), step);
    std::vector<ArrayToSave> arrays = {
        {"w", DType::kFloat32, {8}, {Shard{FullBox({8}), bytes.data()}}}};
    Status s = mgr.Save(step, arrays);
    if (s.ok()) s = mgr.WaitUntilFinished();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
}

TEST(Logger, LinesGoToTheCallersLoggerAndNeverToSpdlogsDefault) {
  // The application's default logger, at its most verbose.
  std::ostringstream app_text;
  const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  auto app = std::make_shared<spdlog::logger>(
      "app", std::make_shared<spdlog::sinks::ostream_sink_mt>(app_text));
  app->set_level(spdlog::level::trace);
  spdlog::set_default_logger(app);
  EXPECT_EQ(spdlog::get("mhckpt"), nullptr) << "the library registers no logger with spdlog";

  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100);
  auto mine = std::make_shared<spdlog::logger>("mine", sink);
  mine->set_level(spdlog::level::trace);
  SetLogger(mine);
  {
    auto mgr = OpenForTest(FreshDir());
    ASSERT_TRUE(mgr);
    ASSERT_NO_FATAL_FAILURE(SaveTwoSteps(*mgr));
  }
  SetLogger(nullptr);
  spdlog::set_default_logger(previous);

  app->flush();
  EXPECT_EQ(app_text.str(), "") << "the library logged through spdlog's default logger";
  const std::vector<std::string> lines = sink->last_formatted();
  if (Rank() == 0) {  // rank 0 logs each commit
    EXPECT_THAT(lines, Contains(HasSubstr("mhckpt: step 1 committed")));
    EXPECT_THAT(lines, Contains(HasSubstr("mhckpt: step 2 committed")));
  }
}

}  // namespace
}  // namespace mhckpt
