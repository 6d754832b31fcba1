// Checksums of box bytes (XXH3-64 from Debian's libxxhash), recorded in the
// commit marker for every written box and checked on restore and verify.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mhckpt {

/// XXH3-64 of `bytes` bytes at `data`.
uint64_t Checksum(const void* data, size_t bytes);

/// The same checksum, fed in pieces (e.g. a large box read in slabs).
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  /// Starts again, as if newly made.
  void Reset();
  void Update(const void* data, size_t bytes);
  [[nodiscard]] uint64_t Digest() const;

 private:
  void* state_;
};

/// The checksum of `bytes` bytes at `data`, and, appended to `chunks`, the
/// checksum of each consecutive piece of `chunk_bytes` bytes (the last may be
/// shorter; one piece, of zero bytes, when `bytes` is 0). One pass over the
/// bytes: each piece is hashed while it is still in cache. `chunk_bytes` > 0.
uint64_t ChecksumChunks(const void* data, size_t bytes, size_t chunk_bytes,
                        std::vector<uint64_t>* chunks);

/// "xxh3:0123456789abcdef" — the marker's spelling.
std::string ChecksumToString(uint64_t checksum);
/// Inverse of ChecksumToString; nullopt on any other text.
std::optional<uint64_t> ChecksumFromString(std::string_view text);

}  // namespace mhckpt
