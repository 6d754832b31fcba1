#include "worker/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "base/pages.h"
#include "worker/fault_guard.h"

namespace mhckpt::internal {
namespace {

constexpr size_t kNoFault = SIZE_MAX;

// Copies bytes [begin, end) of the concatenation of `tasks`; `guarded`: with
// GuardedCopy, returning the index of the first task whose source faulted.
size_t CopyRange(std::span<const CopyTask> tasks, size_t begin, size_t end, bool guarded) {
  size_t offset = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const CopyTask& t = tasks[i];
    size_t lo = std::max(begin, offset), hi = std::min(end, offset + t.bytes);
    if (lo < hi) {
      void* dst = static_cast<std::byte*>(t.dst) + (lo - offset);
      const void* src = static_cast<const std::byte*>(t.src) + (lo - offset);
      if (!guarded) {
        std::memcpy(dst, src, hi - lo);
      } else if (!GuardedCopy(dst, src, hi - lo)) {
        return i;
      }
    }
    offset += t.bytes;
    if (offset >= end) break;
  }
  return kNoFault;
}

size_t CopyParallel(std::span<const CopyTask> tasks, int threads, bool guarded) {
  size_t total = 0;
  for (const CopyTask& t : tasks) total += t.bytes;
  size_t n = std::clamp<size_t>(total / kMinBytesPerCopyThread, 1,
                                static_cast<size_t>(std::max(1, threads)));
  if (n == 1) return CopyRange(tasks, 0, total, guarded);
  std::vector<size_t> faults(n, kNoFault);
  // Pieces end on 4 KiB boundaries, so threads do not share pages.
  size_t piece = (total / n + 4095) / 4096 * 4096;
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (size_t i = 1; i < n; ++i) {
    size_t b = std::min(total, i * piece), e = std::min(total, (i + 1) * piece);
    if (i + 1 == n) e = total;
    try {
      pool.emplace_back([=, &faults] { faults[i] = CopyRange(tasks, b, e, guarded); });
    } catch (const std::system_error&) {
      // No thread to be had (a process or memory limit): this thread copies
      // the piece itself, rather than let the exception leave the started
      // threads unjoined (std::terminate).
      faults[i] = CopyRange(tasks, b, e, guarded);
    }
  }
  faults[0] = CopyRange(tasks, 0, std::min(total, piece), guarded);
  for (std::thread& t : pool) t.join();
  return *std::min_element(faults.begin(), faults.end());
}

}  // namespace

void ParallelCopy(std::span<const CopyTask> tasks, int threads) {
  (void)CopyParallel(tasks, threads, false);
}

std::optional<size_t> ParallelGuardedCopy(std::span<const CopyTask> tasks, int threads) {
  size_t fault = CopyParallel(tasks, threads, true);
  if (fault == kNoFault) return std::nullopt;
  return fault;
}

void CopyUncached(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Streaming stores need 16-byte aligned addresses: memcpy up to one.
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
  _mm_sfence();  // streaming stores are weakly ordered: complete them
#else
  std::memcpy(dst, src, bytes);
#endif
}

PrefaultThread::PrefaultThread(std::vector<std::pair<std::byte*, size_t>> ranges) {
  try {
    thread_ = std::thread([this, ranges = std::move(ranges)] {
      // Pieces that end at multiples of 8 MiB in the address space, on a
      // page boundary for any page size, so that only the range's own ends
      // can cut a page.
      constexpr size_t kPiece = size_t{8} << 20;
      for (const auto& [data, bytes] : ranges) {
        const auto base = reinterpret_cast<uintptr_t>(data);
        for (size_t at = 0; at < bytes;) {
          if (stop_.load(std::memory_order_relaxed)) return;
          const size_t to = std::min(bytes, at + kPiece - (base + at) % kPiece);
          if (!PopulateWholePages(data + at, to - at)) return;
          at = to;
        }
      }
    });
  } catch (const std::system_error&) {
    // No thread: the copy faults the pages itself.
  }
}

PrefaultThread::~PrefaultThread() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      device_(std::exchange(other.device_, -1)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(pinned_, other.pinned_);
  std::swap(device_, other.device_);
  return *this;
}

}  // namespace mhckpt::internal
