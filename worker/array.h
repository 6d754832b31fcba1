// What a rank hands to mhckpt: arrays, and the boxes of them it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/types.h"

namespace mhckpt {

/// Where a buffer lives.
enum class Memory : uint8_t { kHost, kCuda };

/// Most arrays one Save accepts, and most shards one rank hands over in one
/// Save (over all its arrays). They bound what a rank sends in the plan round
/// and the size of the commit marker; beyond them Save fails with
/// InvalidArgument on every rank.
inline constexpr size_t kMaxArraysPerSave = size_t{1} << 20;
inline constexpr size_t kMaxShardsPerRank = size_t{1} << 20;
/// Most bytes of one box, and of all the boxes one rank holds in a save.
inline constexpr uint64_t kMaxBoxBytes = uint64_t{1} << 62;

/// One box of a global array held by this rank, in a contiguous row-major
/// buffer of `Volume(box.count) * DTypeSize(dtype)` bytes.
struct Shard {
  Box box;
  const void* data = nullptr;
  Memory memory = Memory::kHost;
  /// Device memory only. The CUDA device holding `data`; -1: the device CUDA
  /// reports for the pointer.
  int device = -1;
  /// Device memory only. The caller's `cudaStream_t` (as a pointer, so this
  /// header needs no CUDA header) on which the last writes of `data` were
  /// issued: the copy to host is ordered after them, so Save may be called
  /// while a kernel still writes the buffer. nullptr: the device's legacy
  /// default stream (which waits for the blocking streams, not for streams
  /// created with cudaStreamNonBlocking — pass those explicitly).
  void* stream = nullptr;
};

/// An array to save. Every rank lists every array of the checkpoint, with the
/// same name, dtype and shape, and zero or more shards. Two ranks holding the
/// same box are replicas: exactly one of them writes it. A box covering the
/// whole array makes the array fully replicated among its holders.
struct ArrayToSave {
  std::string name;  ///< a relative path: "params/layer0/w"
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  ///< the global shape; empty for a scalar
  std::vector<Shard> shards;
};

/// One box this rank wants back, and the contiguous row-major buffer to fill.
struct Destination {
  Box box;
  void* data = nullptr;
  Memory memory = Memory::kHost;
  /// Device memory only: the CUDA device holding `data` (-1: the device CUDA
  /// reports for the pointer), and the caller's `cudaStream_t` on which
  /// `data` is used. The copies into `data` start only after the work issued
  /// on that stream before Restore (which may still read or write `data`),
  /// and the stream is made to wait for them (nullptr: the legacy default
  /// stream, which does not order streams made with cudaStreamNonBlocking —
  /// pass those explicitly). cudaStreamPerThread is the per-thread stream
  /// of the thread that calls Restore, although the copies run on mhckpt's
  /// I/O thread (Restore orders them with it on the calling thread).
  /// Restore returns after the copies.
  int device = -1;
  void* stream = nullptr;
};

/// An array to restore. Ranks may ask for any boxes (any sharding, any world
/// size), the same box on several ranks, or nothing.
struct ArrayToRestore {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<Destination> shards;
};

}  // namespace mhckpt
