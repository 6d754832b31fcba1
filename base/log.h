// The library's logger: every log line of mhckpt goes through Logger(), a
// logger named "mhckpt" of its own, never through spdlog's default logger
// (which belongs to the application). The caller may replace it with
// mhckpt::SetLogger (coordinator/checkpoint_manager.h), for instance to send
// the lines to its own sinks. Only rank-local messages are logged; errors are
// returned as Status, never only logged.
#pragma once

#include <memory>

#include <spdlog/logger.h>

namespace mhckpt {

/// The logger mhckpt logs through: the one set by SetLogger, else the
/// library's own ("mhckpt", to stderr, level info), made on first use.
/// Thread-safe; the pointer stays valid while the caller holds it.
std::shared_ptr<spdlog::logger> Logger();

/// Makes `logger` the library's logger from now on; nullptr restores the
/// library's own. Thread-safe. Declared for users in
/// coordinator/checkpoint_manager.h.
void SetLogger(std::shared_ptr<spdlog::logger> logger);

}  // namespace mhckpt
