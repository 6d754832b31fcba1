#include "worker/snapshot.h"

#include <cstring>
#include <set>

#include <fmt/format.h>

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
  if (s.memory != Memory::kHost) {
    return InvalidArgument(
        fmt::format("{}: device memory is not supported by this build", where()));
  }
  return bytes;
}

}  // namespace

Status TakeSnapshot(std::span<const ArrayToSave> arrays, int rank, Snapshot* out) {
  Status first_error;
  auto note = [&](Status s) {
    if (first_error.ok() && !s.ok()) first_error = std::move(s);
  };

  // 1. Check every array and shard; size the staging buffer from the valid ones.
  std::set<std::string_view> seen;
  struct Copy {
    const void* src;
    size_t offset, size;
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
      copies.push_back(Copy{s.data, total, *bytes});
      total += *bytes;
    }
  }

  // 2. Copy. The buffer is default-initialized: the copy is its first touch.
  out->bytes.reset(total ? new std::byte[total] : nullptr);
  out->total_bytes = total;
  for (const Copy& c : copies) {
    if (c.size) std::memcpy(out->bytes.get() + c.offset, c.src, c.size);
  }
  return first_error;
}

}  // namespace mhckpt
