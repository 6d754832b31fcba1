// mhckpt-hash-bench: the CPU side of checksums, in one process, against
// memcpy (docs/PERFORMANCE.md, "Two tiers"): XXH3-64
// of 256 KiB in cache, libxxhash's SSE2 build against its run-time
// dispatched one (base/checksum.cc calls the latter); XXH3-64 of 256 MiB
// whole, and ChecksumChunks (a staged box's one pass for the box and its
// chunks) at three chunk sizes; and a copy that hashes on the way, 256 KiB
// at a time, two ways: memcpy then a hash of the destination, and streaming
// stores then a hash of the source from cache (worker/copy.h CopyUncached:
// the copies into the local tier's landing file and the local restore's).
// Medians of 7.
//
//   build/bin/mhckpt-hash-bench
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#define MHCKPT_HAVE_XXH_DISPATCH 1
#endif

#include "base/checksum.h"
#include "worker/copy.h"

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
  {
    // 4,000 hashes of 256 KiB in L2, each build of libxxhash.
    constexpr size_t kSmall = 256 << 10;
    constexpr int kRounds = 4000;
    auto rate = [&](auto hash) {
      return kRounds * double{kSmall} / MedianSeconds([&] {
               for (int r = 0; r < kRounds; ++r) sink = sink + hash(a.data(), kSmall);
             }) /
             1e9;
    };
    const double plain = rate([](const void* p, size_t len) { return XXH3_64bits(p, len); });
#ifdef MHCKPT_HAVE_XXH_DISPATCH
    const double dispatched =
        rate([](const void* p, size_t len) { return XXH3_64bits_dispatch(p, len); });
    std::printf("XXH3 of 256 KiB in cache: SSE2 build %.1f GB/s, dispatched %.1f GB/s\n", plain,
                dispatched);
#else
    std::printf("XXH3 of 256 KiB in cache: %.1f GB/s (no dispatched build)\n", plain);
#endif
  }
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
  constexpr size_t kPiece = 256 << 10;
  const double copy_then_hash_dst = MedianSeconds([&] {
    mhckpt::ChecksumStream sum;
    for (size_t at = 0; at < n; at += kPiece) {
      std::memcpy(b.data() + at, a.data() + at, kPiece);
      sum.Update(b.data() + at, kPiece);
    }
    sink = sink + sum.Digest();
  });
  const double stream_then_hash_src = MedianSeconds([&] {
    mhckpt::ChecksumStream sum;
    for (size_t at = 0; at < n; at += kPiece) {
      mhckpt::internal::CopyUncached(b.data() + at, a.data() + at, kPiece);
      sum.Update(a.data() + at, kPiece);
    }
    sink = sink + sum.Digest();
  });
  std::printf(
      "copy and hash, 256 KiB at a time: memcpy + hash of the destination %.3f s, "
      "streaming stores + hash of the source %.3f s\n",
      copy_then_hash_dst, stream_then_hash_src);
  return 0;
}
