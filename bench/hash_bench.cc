// mhckpt-hash-bench: the CPU side of checksums, in one process, against
// memcpy (docs/PERFORMANCE.md, "Measurements behind the defaults"): XXH3-64 of 256 MiB whole, and
// ChecksumChunks (the save's one pass for a box and its chunks) at three
// chunk sizes. Medians of 7.
//
//   build/bin/mhckpt-hash-bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/checksum.h"

namespace {

template <typename F>
double MedianSeconds(F f) {
  std::vector<double> v;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    v.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(v.begin(), v.end());
  return v[3];
}

}  // namespace

int main() {
  const size_t n = size_t{256} << 20;
  std::vector<unsigned char> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  std::memset(b.data(), 1, n);
  volatile uint64_t sink = 0;
  std::vector<uint64_t> chunks;
  const double copy = MedianSeconds([&] { std::memcpy(b.data(), a.data(), n); });
  const double whole = MedianSeconds([&] { sink = sink + mhckpt::Checksum(a.data(), n); });
  std::printf("256 MiB, medians of 7: memcpy %.3f s (%.1f GB/s), XXH3 whole %.3f s (%.1f GB/s)\n",
              copy, n / copy / 1e9, whole, n / whole / 1e9);
  for (size_t chunk : {size_t{256} << 10, size_t{1} << 20, size_t{4} << 20}) {
    const double t = MedianSeconds([&] {
      chunks.clear();
      sink = sink + mhckpt::ChecksumChunks(a.data(), n, chunk, &chunks);
    });
    std::printf("ChecksumChunks, chunks of %zu KiB: %.3f s\n", chunk >> 10, t);
  }
  return 0;
}
