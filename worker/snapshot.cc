#include "worker/snapshot.h"

#include <cstring>
#include <set>

#include <fmt/format.h>

#include "worker/copy.h"

namespace mhckpt {
namespace {

// Checks one shard of `a`; returns its byte size or the error.
Result<size_t> CheckShard(const ArrayToSave& a, const Shard& s, int rank) {
  auto where = [&] {
    return fmt::format("array '{}' on rank {}, box {}", a.name, rank, BoxToString(s.box));
  };
  if (std::string why = CheckBoxInShape(s.box, a.shape); !why.empty()) {
    return InvalidArgument(
        fmt::format("{}: box outside shape {}: {}", where(), ShapeToString(a.shape), why));
  }
  auto n = Volume(s.box.count);
  if (!n) return InvalidArgument(fmt::format("{}: box volume overflows", where()));
  size_t bytes = static_cast<size_t>(*n) * DTypeSize(a.dtype);
  if (bytes > 0 && s.data == nullptr)
    return InvalidArgument(fmt::format("{}: data is null", where()));
  if (s.memory == Memory::kCuda && bytes > 0 && !CudaAvailable()) {
    return InvalidArgument(fmt::format("{}: device memory, but no CUDA device is usable", where()));
  }
  return bytes;
}

}  // namespace

Status TakeSnapshot(std::span<const ArrayToSave> arrays, const SnapshotOptions& options,
                    StagingPool& pool, Snapshot* out) {
  const int rank = options.rank;
  Status first_error;
  auto note = [&](Status s) {
    if (first_error.ok() && !s.ok()) first_error = std::move(s);
  };

  // 1. Check every array and shard; size the staging buffer from the valid ones.
  std::set<std::string_view> seen;
  struct Copy {
    const void* src;
    size_t offset, size;
    Memory memory;
  };
  std::vector<Copy> copies;
  size_t total = 0;
  out->arrays.clear();
  out->arrays.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const ArrayToSave& a = arrays[i];
    out->arrays.push_back(StagedArray{a.name, a.dtype, a.shape, {}});
    if (std::string why = CheckArrayName(a.name); !why.empty()) {
      note(InvalidArgument(fmt::format("array '{}' on rank {}: bad name: {}", a.name, rank, why)));
      continue;
    }
    if (!seen.insert(a.name).second) {
      note(InvalidArgument(fmt::format("array '{}' on rank {}: duplicate name", a.name, rank)));
      continue;
    }
    if (!IsValidDType(a.dtype)) {
      note(InvalidArgument(fmt::format("array '{}' on rank {}: invalid dtype {}", a.name, rank,
                                       static_cast<int>(a.dtype))));
      continue;
    }
    if (!Volume(a.shape)) {
      note(InvalidArgument(fmt::format("array '{}' on rank {}: invalid shape {}", a.name, rank,
                                       ShapeToString(a.shape))));
      continue;
    }
    for (const Shard& s : a.shards) {
      Result<size_t> bytes = CheckShard(a, s, rank);
      if (!bytes.ok()) {
        note(bytes.status());
        continue;
      }
      out->arrays.back().boxes.push_back(StagedBox{s.box, total, *bytes});
      copies.push_back(Copy{s.data, total, *bytes, s.memory});
      total += *bytes;
    }
  }

  // 2. Staging memory from the pool (reused between saves; may wait for budget).
  Result<StagingBuffer> buffer = pool.Acquire(total, &out->budget_wait_seconds);
  if (!buffer.ok()) {
    for (StagedArray& a : out->arrays) a.boxes.clear();
    out->total_bytes = 0;
    note(Status(buffer.status().code(),
                fmt::format("rank {}: {}", rank, buffer.status().message())));
    return first_error;
  }
  out->buffer = std::move(buffer).value();
  out->total_bytes = total;

  // 3. Copy: host boxes on several threads, device boxes through CUDA.
  std::vector<CopyTask> host, device;
  for (const Copy& c : copies) {
    CopyTask t{out->buffer.data() + c.offset, c.src, c.size};
    if (c.size == 0) continue;
    (c.memory == Memory::kCuda ? device : host).push_back(t);
  }
  if (!device.empty()) {
    Status s = CopyDeviceToHost(device);
    if (!s.ok()) note(Status(s.code(), fmt::format("rank {}: {}", rank, s.message())));
  }
  ParallelCopy(host, options.threads);
  return first_error;
}

}  // namespace mhckpt
