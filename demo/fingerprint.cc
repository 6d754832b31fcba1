#include "demo/fingerprint.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "demo/rng.h"

namespace mhckpt::demo {
namespace {

// Sum of ElementHash over the elements of `box`, whose row-major bytes are at
// `data`. Walks the box one innermost run at a time.
uint64_t BoxSum(uint64_t name_hash, size_t elem_size, const std::vector<int64_t>& shape,
                const Box& box, const std::byte* data) {
  const int64_t volume = Volume(box.count).value_or(0);
  if (volume == 0) return 0;
  const size_t rank = shape.size();
  const int64_t run = rank == 0 ? 1 : box.count[rank - 1];
  std::vector<int64_t> idx(rank, 0);  // position inside the box of the run's first element
  uint64_t sum = 0;
  for (int64_t done = 0; done < volume; done += run) {
    int64_t first = 0;
    for (size_t d = 0; d < rank; ++d) first = first * shape[d] + box.start[d] + idx[d];
    for (int64_t k = 0; k < run; ++k) {
      uint64_t value = 0;
      std::memcpy(&value, data + static_cast<size_t>(done + k) * elem_size, elem_size);
      sum += ElementHash(name_hash, static_cast<uint64_t>(first + k), value);
    }
    for (size_t d = rank >= 1 ? rank - 1 : 0; d-- > 0;) {  // next run: advance the outer dims
      if (++idx[d] < box.count[d]) break;
      idx[d] = 0;
    }
  }
  return sum;
}

}  // namespace

uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t ElementHash(uint64_t name_hash, uint64_t index, uint64_t value) {
  return SplitMix64(name_hash + SplitMix64(index + SplitMix64(value)));
}

uint64_t LocalFingerprint(std::span<const ArrayToSave> arrays, int rank) {
  uint64_t sum = 0;
  for (const ArrayToSave& a : arrays) {
    const uint64_t name_hash = Fnv1a64(a.name);
    const Box whole = FullBox(a.shape);
    for (const Shard& s : a.shards) {
      if (s.box == whole && rank != 0) continue;  // a replica: rank 0 counts it
      sum += BoxSum(name_hash, DTypeSize(a.dtype), a.shape, s.box,
                    static_cast<const std::byte*>(s.data));
    }
  }
  return sum;
}

uint64_t GlobalFingerprint(std::span<const ArrayToSave> arrays, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  uint64_t local = LocalFingerprint(arrays, rank), global = 0;
  // Unsigned addition wraps: the sum mod 2^64, whatever the reduction order.
  MPI_Allreduce(&local, &global, 1, MPI_UINT64_T, MPI_SUM, comm);
  return global;
}

std::string FingerprintHex(uint64_t fingerprint) { return fmt::format("{:016x}", fingerprint); }

}  // namespace mhckpt::demo
