#include "base/checksum.h"

#include <xxhash.h>

#include <charconv>

#include <fmt/format.h>

namespace mhckpt {

uint64_t Checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

ChecksumStream::~ChecksumStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChecksumStream::Update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t ChecksumStream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

std::string ChecksumToString(uint64_t checksum) { return fmt::format("xxh3:{:016x}", checksum); }

std::optional<uint64_t> ChecksumFromString(std::string_view text) {
  constexpr std::string_view kPrefix = "xxh3:";
  if (text.size() != kPrefix.size() + 16 || text.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  uint64_t v = 0;
  const char* begin = text.data() + kPrefix.size();
  auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), v, 16);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace mhckpt
