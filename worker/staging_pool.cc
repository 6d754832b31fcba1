#include "worker/staging_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "base/pages.h"

namespace mhckpt::internal {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n) { return (n + kHugePage - 1) / kHugePage * kHugePage; }

std::byte* Map(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  // Faulting in 2 MiB pages is several times faster than 4 KiB ones here.
  madvise(p, bytes, MADV_HUGEPAGE);
  return static_cast<std::byte*>(p);
}

// Faults in every page of [p, p + bytes) for writing, without changing
// their contents (fresh anonymous memory reads as zeros either way).
void Touch(std::byte* p, size_t bytes) {
  if (PopulateWholePages(p, bytes)) return;  // p and bytes are whole pages
  for (size_t i = 0; i < bytes; i += 4096) {
    reinterpret_cast<volatile std::byte*>(p)[i] = std::byte{0};
  }
}

// The buffer a pool with SetCarryOver left for the next one (at most one).
struct Carried {
  std::mutex mu;
  std::byte* data = nullptr;
  size_t size = 0;
};
Carried& CarriedBuffer() {
  static Carried c;
  return c;
}

}  // namespace

StagingBuffer::StagingBuffer(StagingBuffer&& o) noexcept { *this = std::move(o); }

StagingBuffer& StagingBuffer::operator=(StagingBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    std::swap(pool_, o.pool_);
    std::swap(owner_, o.owner_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(pinned_, o.pinned_);
  }
  return *this;
}

StagingBuffer::~StagingBuffer() { Release(); }

StagingBuffer StagingBuffer::Borrowed(std::byte* data, size_t size, std::shared_ptr<void> owner) {
  StagingBuffer b;
  b.owner_ = std::move(owner);
  b.data_ = data;
  b.size_ = size;
  return b;
}

void StagingBuffer::Release() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Return(data_);
  owner_.reset();
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  pinned_ = false;
}

StagingPool::StagingPool(size_t budget_bytes) : budget_(budget_bytes) {}

StagingPool::~StagingPool() {
  if (toucher_.joinable()) toucher_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (carry_over_ && !blocks_.empty()) {
    // The largest buffer goes to the next pool (unpinned: that pool pins it
    // at first use, on its own device); the one carried before, if smaller,
    // is freed.
    size_t largest = 0;
    for (size_t i = 1; i < blocks_.size(); ++i) {
      if (blocks_[i].size > blocks_[largest].size) largest = i;
    }
    Block b = blocks_[largest];
    blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(largest));
    if (on_free_ && b.hooked) on_free_(b.data);
    Carried& c = CarriedBuffer();
    std::lock_guard<std::mutex> carried(c.mu);
    if (c.size < b.size) {
      if (c.data != nullptr) munmap(c.data, c.size);
      c.data = b.data;
      c.size = b.size;
    } else {
      munmap(b.data, b.size);
    }
    allocated_ -= b.size;
  }
  while (!blocks_.empty()) FreeBlock(blocks_.size() - 1);
}

void StagingPool::SetHooks(std::function<bool(void*, size_t)> on_new,
                           std::function<void(void*)> on_free) {
  std::lock_guard<std::mutex> lock(mu_);
  on_new_ = std::move(on_new);
  on_free_ = std::move(on_free);
}

size_t StagingPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

size_t StagingPool::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const Block& b : blocks_) n += b.hooked ? b.size : 0;
  return n;
}

int StagingPool::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

void StagingPool::FreeBlock(size_t index) {
  Block b = blocks_[index];
  blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(index));
  if (on_free_ && b.hooked) on_free_(b.data);
  munmap(b.data, b.size);
  allocated_ -= b.size;
}

Status StagingPool::Reserve(size_t bytes) {
  if (bytes == 0) return OkStatus();
  const size_t want = RoundUp(bytes);
  std::byte* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Block& b : blocks_) {
      if (b.size >= want) return OkStatus();
    }
    if (budget_ != 0 && allocated_ + want > budget_) return OkStatus();
    p = Map(want);
    if (p == nullptr) {
      return IoError(
          fmt::format("cannot map {} bytes of staging memory: {}", want, std::strerror(errno)));
    }
    blocks_.push_back(Block{p, want, false, true});
    allocated_ += want;
  }
  if (toucher_.joinable()) toucher_.join();
  auto touch = [this, p, want] {
    Touch(p, want);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Block& b : blocks_) {
        if (b.data == p) b.touching = false;
      }
    }
    cv_.notify_all();
  };
  try {
    toucher_ = std::thread(touch);
  } catch (const std::system_error&) {
    touch();  // no thread to be had: touch it here
  }
  return OkStatus();
}

Result<StagingBuffer> StagingPool::Acquire(size_t bytes, double* waited_seconds) {
  StagingBuffer out;
  if (waited_seconds) *waited_seconds = 0;
  if (bytes == 0) return out;
  const size_t want = RoundUp(bytes);
  const size_t budget = budget_ ? budget_ : want;
  auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // 1. The smallest free block that fits.
    size_t best = blocks_.size();
    bool any_in_use = false;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      any_in_use |= blocks_[i].in_use || blocks_[i].touching;
      if (!blocks_[i].in_use && blocks_[i].size >= want &&
          (best == blocks_.size() || blocks_[i].size < blocks_[best].size)) {
        best = i;
      }
    }
    if (best < blocks_.size() && blocks_[best].touching) {
      // Reserve's thread is still touching it: wait for the rest.
      ++waiting_;
      cv_.wait(lock);
      --waiting_;
      continue;
    }
    if (best < blocks_.size()) {
      Lend(best, bytes, &out);
      break;
    }
    // 2. Make room: free blocks nobody uses are too small to serve anyone now.
    for (size_t i = blocks_.size(); i-- > 0;) {
      if (!blocks_[i].in_use && !blocks_[i].touching && allocated_ + want > budget) FreeBlock(i);
    }
    // 3. A new block, within the budget (or alone, if larger than the budget).
    if (allocated_ + want <= budget || !any_in_use) {
      if (carry_over_) {
        // The buffer an earlier pool left, if it fits and the budget allows.
        Carried& c = CarriedBuffer();
        std::lock_guard<std::mutex> carried(c.mu);
        if (c.data != nullptr && c.size >= want && (allocated_ + c.size <= budget || !any_in_use)) {
          blocks_.push_back(Block{c.data, c.size, false});
          allocated_ += c.size;
          Lend(blocks_.size() - 1, bytes, &out);
          c.data = nullptr;
          c.size = 0;
          break;
        }
      }
      std::byte* p = Map(want);
      if (p == nullptr) {
        return IoError(
            fmt::format("cannot map {} bytes of staging memory: {}", want, std::strerror(errno)));
      }
      blocks_.push_back(Block{p, want, false});
      allocated_ += want;
      Lend(blocks_.size() - 1, bytes, &out);
      break;
    }
    // 4. Wait for an earlier save to give its buffer back.
    ++waiting_;
    cv_.wait(lock);
    --waiting_;
  }
  if (waited_seconds) {
    *waited_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return out;
}

void StagingPool::Lend(size_t index, size_t bytes, StagingBuffer* out) {
  Block& b = blocks_[index];
  b.in_use = true;
  // Pinned at first use, when a device to pin for is known; tried again at
  // every use until it succeeds: a block marked pinned after a failure would
  // stay pageable for good, and its copies slow.
  if (!b.hooked && on_new_) b.hooked = on_new_(b.data, b.size);
  out->pool_ = this;
  out->data_ = b.data;
  out->size_ = bytes;
  out->pinned_ = b.hooked;
}

void StagingPool::Return(std::byte* data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Block& b : blocks_) {
      if (b.data == data) b.in_use = false;
    }
  }
  cv_.notify_all();
}

}  // namespace mhckpt::internal
