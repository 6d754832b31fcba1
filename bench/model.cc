#include "bench/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace mhckpt::bench {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// Word `k` of the stream `seed` (splitmix64: the state after k + 1 steps, mixed).
inline uint64_t Word(uint64_t seed, uint64_t k) {
  uint64_t z = seed * kGolden + (k + 1) * kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

void Fill(std::byte* p, size_t n, uint64_t seed, uint64_t offset) {
  uint64_t k = offset / 8;
  size_t i = 0;
  if (const size_t skip = offset % 8; skip != 0 && n > 0) {  // an unaligned head
    const uint64_t z = Word(seed, k++);
    i = std::min(n, 8 - skip);
    std::memcpy(p, reinterpret_cast<const std::byte*>(&z) + skip, i);
  }
  for (; i + 8 <= n; i += 8) {
    const uint64_t z = Word(seed, k++);
    std::memcpy(p + i, &z, 8);
  }
  if (i < n) {
    const uint64_t z = Word(seed, k);
    std::memcpy(p + i, &z, n - i);
  }
}

bool CheckFill(const std::byte* p, size_t n, uint64_t seed, uint64_t offset) {
  constexpr size_t kChunk = size_t{64} << 10;
  std::vector<std::byte> expected(std::min(n, kChunk));
  for (size_t done = 0; done < n; done += kChunk) {
    const size_t len = std::min(kChunk, n - done);
    Fill(expected.data(), len, seed, offset + done);
    if (std::memcmp(expected.data(), p + done, len) != 0) return false;
  }
  return true;
}

uint64_t NameSeed(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ULL;
  }
  return h;
}

bool IsSharded(const ArraySpec& a, int size) {
  return a.shard && !a.shape.empty() && a.shape[0] >= size;
}

Box LocalBox(const ArraySpec& a, int rank, int size) {
  Box box = FullBox(a.shape);
  if (IsSharded(a, size)) {
    const int64_t rows = a.shape[0];
    const int64_t begin = rows * rank / size, end = rows * (rank + 1) / size;
    box.start[0] = begin;
    box.count[0] = end - begin;
  }
  return box;
}

uint64_t RowBytes(const ArraySpec& a) {
  std::vector<int64_t> row(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end());
  return static_cast<uint64_t>(*Volume(row)) * DTypeSize(a.dtype);
}

uint64_t ArrayBytes(const ArraySpec& a) {
  return static_cast<uint64_t>(*Volume(a.shape)) * DTypeSize(a.dtype);
}

namespace {

// The byte offset of `box` (a row range, or the whole array) in its array.
uint64_t BoxOffset(const ArraySpec& a, const Box& box) {
  return box.start.empty() ? 0 : static_cast<uint64_t>(box.start[0]) * RowBytes(a);
}

size_t BoxBytes(const ArraySpec& a, const Box& box) {
  return static_cast<size_t>(*Volume(box.count)) * DTypeSize(a.dtype);
}

// bf16 parameters, fp32 master weights and Adam moments: 14 bytes per parameter.
struct Kind {
  const char* prefix;
  DType dtype;
};
constexpr Kind kKinds[] = {{"params", DType::kBFloat16},
                           {"master", DType::kFloat32},
                           {"adam_m", DType::kFloat32},
                           {"adam_v", DType::kFloat32}};
constexpr double kBytesPerParam = 14.0;

}  // namespace

std::vector<ArraySpec> TrainingStateSpecs(const TrainingStateConfig& c, int size) {
  constexpr int64_t kCols = 4096;
  constexpr const char* kTensors[] = {"embedding", "mlp"};
  const double params = c.mib * 1024 * 1024 / kBytesPerParam;
  const int64_t rows = std::max<int64_t>(size, std::llround(params / 2 / kCols));
  const bool shard = !c.replicate_all;
  std::vector<ArraySpec> out;
  for (const Kind& k : kKinds) {
    for (const char* t : kTensors) {
      out.push_back({fmt::format("{}/{}", k.prefix, t), k.dtype, {rows, kCols}, shard});
    }
  }
  for (int i = 0; i < c.small; ++i) {
    out.push_back({fmt::format("norms/{:03d}", i), DType::kFloat32, {kCols}, false});
  }
  out.push_back({"step", DType::kInt64, {}, false});
  out.push_back({"rng_state", DType::kUInt32, {624}, false});
  return out;
}

std::vector<ArraySpec> ManySmallSpecs(double mib, int arrays) {
  // Layers x 16 tensors + 4 more, each in 4 kinds: 156 layers for 10,000 arrays.
  static_assert((156 * 16 + 4) * 4 == kManySmallArrays);
  const int kLayers = std::max(1, (arrays / 4 - 4) / 16);
  const double params = mib * 1024 * 1024 / kBytesPerParam;
  // The layers get about 70% of the parameters: kLayers * (12 d^2 + 13 d).
  const double per_layer = 0.7 * params / kLayers;
  const auto d =
      std::max<int64_t>(4, static_cast<int64_t>((-13 + std::sqrt(169 + 48 * per_layer)) / 24));
  const double rest = std::max(0.0, params - static_cast<double>(kLayers * (12 * d * d + 13 * d)) -
                                        2.0 * static_cast<double>(d));
  const int64_t vocab = std::max<int64_t>(1, std::llround(rest * 0.8 / static_cast<double>(d)));
  const int64_t positions = std::max<int64_t>(1, std::llround(rest * 0.2 / static_cast<double>(d)));

  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Tensor> tensors;
  tensors.push_back({"token_embedding", {vocab, d}});
  tensors.push_back({"position_embedding", {positions, d}});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = fmt::format("layers/{:03d}/", l);
    tensors.push_back({p + "ln1/w", {d}});
    tensors.push_back({p + "ln1/b", {d}});
    for (const char* m : {"q", "k", "v", "o"}) {
      tensors.push_back({p + "attn/" + m + "/w", {d, d}});
      tensors.push_back({p + "attn/" + m + "/b", {d}});
    }
    tensors.push_back({p + "ln2/w", {d}});
    tensors.push_back({p + "ln2/b", {d}});
    tensors.push_back({p + "mlp/up/w", {4 * d, d}});
    tensors.push_back({p + "mlp/up/b", {4 * d}});
    tensors.push_back({p + "mlp/down/w", {d, 4 * d}});
    tensors.push_back({p + "mlp/down/b", {d}});
  }
  tensors.push_back({"final_norm/w", {d}});
  tensors.push_back({"final_norm/b", {d}});

  std::vector<ArraySpec> out;
  out.reserve(tensors.size() * 4);
  for (const Kind& k : kKinds) {
    for (const Tensor& t : tensors) {
      const bool embedding = t.name.ends_with("_embedding");
      out.push_back(
          {fmt::format("{}/{}", k.prefix, t.name), k.dtype, t.shape, embedding, !embedding});
    }
  }
  return out;
}

std::vector<ArraySpec> OneArraySpecs(uint64_t bytes) {
  return {{"one_array", DType::kUInt8, {static_cast<int64_t>(bytes)}, true}};
}

std::vector<int> Holders(const std::vector<ArraySpec>& specs, int size) {
  std::vector<int> holder(specs.size(), -1);
  std::vector<uint64_t> load(static_cast<size_t>(size), 0);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].one_holder) continue;
    const auto least = std::min_element(load.begin(), load.end());
    *least += ArrayBytes(specs[i]);
    holder[i] = static_cast<int>(least - load.begin());
  }
  return holder;
}

Model Materialize(std::vector<ArraySpec> specs, int rank, int size) {
  Model m;
  m.specs = std::move(specs);
  const std::vector<int> holder = Holders(m.specs, size);
  auto add = [&](std::vector<ArrayToSave>& to, const ArraySpec& a) {
    const Box box = LocalBox(a, rank, size);
    const size_t bytes = BoxBytes(a, box);
    // new[] without "()": no zeroing pass; Fill touches every page once.
    m.buffers.emplace_back(new std::byte[std::max<size_t>(bytes, 1)]);
    Fill(m.buffers.back().get(), bytes, NameSeed(a.name), BoxOffset(a, box));
    to.push_back(ArrayToSave{a.name, a.dtype, a.shape, {Shard{box, m.buffers.back().get()}}});
    return bytes;
  };
  m.arrays.reserve(m.specs.size());
  for (size_t i = 0; i < m.specs.size(); ++i) {
    const ArraySpec& a = m.specs[i];
    if (holder[i] >= 0 && holder[i] != rank) {  // another rank's: listed, no box
      m.arrays.push_back(ArrayToSave{a.name, a.dtype, a.shape, {}});
      m.global_bytes += ArrayBytes(a);
      continue;
    }
    const size_t bytes = add(m.arrays, a);
    m.boxes.emplace_back(m.buffers.back().get(), bytes);
    m.local_bytes += bytes;
    m.global_bytes += ArrayBytes(a);
    if (holder[i] < 0 && IsSharded(a, size)) {
      ++m.large_arrays;
    } else {
      m.replicated_bytes += bytes;
      ++m.small_arrays;
    }
  }
  m.arrays_with_extra = m.arrays;
  add(m.arrays_with_extra, ArraySpec{"bench/plan_tag", DType::kInt32, {1}, false});
  return m;
}

Model BuildModel(const TrainingStateConfig& c, int rank, int size) {
  return Materialize(TrainingStateSpecs(c, size), rank, size);
}

void Destinations::Scrub(std::byte value) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (bytes[i] > 0) std::memset(data[i], static_cast<int>(value), bytes[i]);
  }
}

int Destinations::Verify(std::string* first_bad) const {
  int bad = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ArraySpec& a = specs[i];
    if (arrays[i].shards.empty()) continue;  // another rank's
    if (CheckFill(data[i], bytes[i], NameSeed(a.name), BoxOffset(a, boxes[i]))) continue;
    if (bad++ == 0 && first_bad != nullptr) *first_bad = a.name + " " + BoxToString(boxes[i]);
  }
  return bad;
}

constexpr size_t kPage = 4096;

// numpy's advice for a new array's data (numpy/core/src/multiarray/alloc.c,
// on Linux, for 4 MiB or more): MADV_HUGEPAGE from the first page boundary
// on; refusals ignored.
void AdviseHugePages(std::byte* data, size_t bytes) {
  const size_t head = (kPage - reinterpret_cast<uintptr_t>(data) % kPage) % kPage;
  if (bytes > head) (void)madvise(data + head, bytes - head, MADV_HUGEPAGE);
}

Destinations AllocateDestinations(std::vector<ArraySpec> specs, int rank, int size, bool touch,
                                  bool huge_pages) {
  Destinations d;
  d.specs = std::move(specs);
  const std::vector<int> holder = Holders(d.specs, size);
  for (size_t i = 0; i < d.specs.size(); ++i) {
    const ArraySpec& a = d.specs[i];
    Box box = LocalBox(a, rank, size);
    if (holder[i] >= 0 && holder[i] != rank) {  // another rank's: asks for nothing
      d.buffers.emplace_back();
      d.data.push_back(nullptr);
      d.arrays.push_back(ArrayToRestore{a.name, a.dtype, {}});
      d.boxes.push_back(std::move(box));
      d.bytes.push_back(0);
      continue;
    }
    const size_t bytes = BoxBytes(a, box);
    // new[] without "()": the pages stay untouched unless `touch`. A page
    // more, to start the data on a page boundary (mhckpt-py's new_array).
    d.buffers.emplace_back(new std::byte[bytes + kPage]);
    std::byte* at = d.buffers.back().get();
    at += (kPage - reinterpret_cast<uintptr_t>(at) % kPage) % kPage;
    d.data.push_back(at);
    if (huge_pages && bytes >= (size_t{4} << 20)) AdviseHugePages(at, bytes);
    if (touch) std::memset(at, 0, bytes);
    d.arrays.push_back(ArrayToRestore{a.name, a.dtype, {Destination{box, at}}});
    d.boxes.push_back(std::move(box));
    d.bytes.push_back(bytes);
    d.local_bytes += bytes;
  }
  return d;
}

}  // namespace mhckpt::bench
