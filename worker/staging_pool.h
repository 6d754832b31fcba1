// Host staging memory, kept between saves.
//
// Fresh memory is slow to touch on these machines (0.25-0.7 GiB/s against
// ~10 GiB/s for a copy into touched memory), so buffers are allocated once
// (with transparent huge pages where the kernel gives them), touched by the
// first save, and reused by every later one. Reserve maps and touches a
// buffer ahead, on a thread of its own, so that the first save finds it
// ready. A byte budget bounds the total: a save that would exceed it waits
// until an earlier save releases its buffer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"

namespace mhckpt::internal {

class StagingPool;

/// A buffer lent by the pool; returns to it when destroyed.
class StagingBuffer {
 public:
  StagingBuffer() = default;
  StagingBuffer(StagingBuffer&& o) noexcept;
  StagingBuffer& operator=(StagingBuffer&& o) noexcept;
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer();

  /// Memory that is not the pool's (the local tier's landing file,
  /// coordinator/local_landing.h): `owner` is let go when the buffer is.
  static StagingBuffer Borrowed(std::byte* data, size_t size, std::shared_ptr<void> owner);

  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }
  /// Whether the pool's on_new hook succeeded on the memory when it was
  /// lent (for device copies: page-locked, so DMA runs at full speed).
  /// False for Borrowed memory.
  [[nodiscard]] bool pinned() const { return pinned_; }

 private:
  friend class StagingPool;
  void Release();
  StagingPool* pool_ = nullptr;
  std::shared_ptr<void> owner_;  // Borrowed's
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

class StagingPool {
 public:
  /// `budget_bytes`: the most host memory the pool holds at once. 0 means
  /// "one save": a save waits for the previous one to release its buffer, so
  /// staging never exceeds one copy of the largest local checkpoint.
  explicit StagingPool(size_t budget_bytes = 0);
  ~StagingPool();  ///< all buffers must have been returned
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  /// A buffer of at least `bytes`: a free one if one fits, else a new one if
  /// the budget allows (freeing unused smaller ones first), else it waits for
  /// a buffer in use to come back. A request larger than the budget is served
  /// once nothing else is in use. `waited_seconds` gets the time spent waiting.
  /// IoError if the operating system refuses the memory.
  Result<StagingBuffer> Acquire(size_t bytes, double* waited_seconds = nullptr);

  /// Maps a free buffer of `bytes` now and touches its pages on a thread of
  /// its own (MADV_POPULATE_WRITE, or a write per page on kernels before
  /// 5.14), so that the first Acquire that it fits costs no page faults.
  /// An Acquire that picks the buffer while it is being touched waits for the
  /// rest (counted in `waited_seconds`). Does nothing if the pool already
  /// holds a buffer of that size, or if it would exceed the budget; IoError
  /// if the operating system refuses the memory.
  Status Reserve(size_t bytes);

  /// Hands the pool's buffers, when it is destroyed, to the next pool of the
  /// process made with this set too (the process keeps at most one: the
  /// largest, until that pool takes it); and lets this pool take the one a
  /// pool destroyed before it left. For code that opens a manager per save
  /// (one directory per checkpoint, as PyTorch DCP does): each save then
  /// copies into touched memory. Set before the first Acquire.
  void SetCarryOver(bool carry) { carry_over_ = carry; }

  /// `on_new` prepares a buffer (pins it for DMA) and says whether it
  /// succeeded; it runs when a buffer is lent and has not succeeded on it
  /// yet, so a buffer that could not be pinned (no device known yet, or
  /// CUDA refused) is tried again at its next use rather than left pageable
  /// for good. `on_free` undoes it before the buffer is unmapped, only where
  /// `on_new` succeeded. Set before the first Acquire.
  void SetHooks(std::function<bool(void*, size_t)> on_new, std::function<void(void*)> on_free);

  [[nodiscard]] size_t allocated_bytes() const;
  /// Of allocated_bytes, those on which on_new succeeded (pinned).
  [[nodiscard]] size_t pinned_bytes() const;
  /// How many Acquire calls are waiting for a buffer to come back.
  [[nodiscard]] int waiting() const;
  [[nodiscard]] size_t budget_bytes() const { return budget_; }

 private:
  friend class StagingBuffer;
  struct Block {
    std::byte* data;
    size_t size;
    bool in_use;
    bool touching = false;  ///< Reserve's thread is still touching it
    bool hooked = false;    ///< on_new_ has succeeded on it (tried at each use until then)
  };
  void Return(std::byte* data);
  void FreeBlock(size_t index);  // mu_ held
  // Lends blocks_[index] to `out`, running on_new_ first if it has not
  // succeeded on the block yet. mu_ held.
  void Lend(size_t index, size_t bytes, StagingBuffer* out);

  const size_t budget_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Block> blocks_;
  size_t allocated_ = 0;
  int waiting_ = 0;
  std::function<bool(void*, size_t)> on_new_;
  std::function<void(void*)> on_free_;
  std::thread toucher_;  // Reserve's
  bool carry_over_ = false;
};

}  // namespace mhckpt::internal
