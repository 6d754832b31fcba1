#include "base/checksum.h"

#include <xxhash.h>
// On x86-64, Debian's libxxhash also exports the XXH3 entry points as
// "_dispatch" variants that pick AVX2 (or AVX-512) at run time; the plain
// ones are built for SSE2. The header maps the plain names onto them. Same
// values either way: the vector width is not part of the hash.
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <charconv>
#include <cstddef>

#include <fmt/format.h>

namespace mhckpt {

uint64_t Checksum(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

ChecksumStream::ChecksumStream() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

ChecksumStream::~ChecksumStream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void ChecksumStream::Reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

void ChecksumStream::Update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t ChecksumStream::Digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t ChecksumChunks(const void* data, size_t bytes, size_t chunk_bytes,
                        std::vector<uint64_t>* chunks) {
  // A chunk of 1 MiB or more does not stay in L2 while it is hashed twice;
  // pieces of 256 KiB do, so each piece is read from memory once and fed to
  // both the chunk's and the box's stream.
  constexpr size_t kPiece = 256 << 10;
  const auto* p = static_cast<const std::byte*>(data);
  ChecksumStream whole, chunk;
  size_t done = 0;
  do {
    const size_t n = std::min(chunk_bytes, bytes - done);
    if (n <= kPiece) {
      chunks->push_back(Checksum(p + done, n));
      whole.Update(p + done, n);
    } else {
      chunk.Reset();
      for (size_t k = 0; k < n; k += kPiece) {
        const size_t m = std::min(kPiece, n - k);
        chunk.Update(p + done + k, m);
        whole.Update(p + done + k, m);
      }
      chunks->push_back(chunk.Digest());
    }
    done += n;
  } while (done < bytes);
  return whole.Digest();
}

std::string ChecksumToString(uint64_t checksum) { return fmt::format("xxh3:{:016x}", checksum); }

std::optional<uint64_t> ChecksumFromString(std::string_view text) {
  constexpr std::string_view kPrefix = "xxh3:";
  if (text.size() != kPrefix.size() + 16 || text.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  // Lowercase only, as ChecksumToString writes it: one spelling per value.
  for (char c : text.substr(kPrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  uint64_t v = 0;
  const char* begin = text.data() + kPrefix.size();
  auto [ptr, ec] = std::from_chars(begin, text.data() + text.size(), v, 16);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace mhckpt
