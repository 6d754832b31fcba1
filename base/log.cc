#include "base/log.h"

#include <mutex>
#include <utility>

#include <spdlog/sinks/stdout_sinks.h>

namespace mhckpt {
namespace {

// The library's own logger: not registered with spdlog (a registry name the
// application may use), so spdlog::drop_all or set_default_logger never
// touch it, and it never touches theirs.
std::shared_ptr<spdlog::logger> MakeOwnLogger() {
  auto logger =
      std::make_shared<spdlog::logger>("mhckpt", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  logger->set_level(spdlog::level::info);
  return logger;
}

struct State {
  std::mutex mutex;
  std::shared_ptr<spdlog::logger> logger;  // guarded by mutex; null: the own one
};

State& GetState() {
  static State state;
  return state;
}

}  // namespace

std::shared_ptr<spdlog::logger> Logger() {
  static const std::shared_ptr<spdlog::logger> own = MakeOwnLogger();  // made once, thread-safe
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.logger ? state.logger : own;
}

void SetLogger(std::shared_ptr<spdlog::logger> logger) {
  State& state = GetState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.logger = std::move(logger);
}

}  // namespace mhckpt
