// Small text helpers shared by the CLI's commands.
#pragma once

#include <cstdint>
#include <string>

namespace mhckpt::cli {

/// "512 B", "64.1 MiB", "1.50 GiB".
std::string HumanBytes(uint64_t bytes);

/// "2026-11-29 20:07:06" in local time, from milliseconds since the epoch.
std::string LocalTime(int64_t unix_ms);

}  // namespace mhckpt::cli
