// The benchmarks' models: which arrays a rank saves, how they are laid out over
// the ranks, and what their bytes are.
//
// Every byte of an array is a function of (the array's name, its offset in the
// array's global row-major bytes) only: a rank regenerates the bytes of any box
// at any world size, so a checkpoint saved at N ranks is verified after a
// restore at M ranks without reading anything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/checkpoint_manager.h"

namespace mhckpt::bench {

/// Pseudo-random bytes (splitmix64 in counter mode): p[i] is byte
/// `offset + i` of the stream `seed`, little-endian 8-byte words. Every page
/// of `p` is written once.
void Fill(std::byte* p, size_t n, uint64_t seed, uint64_t offset = 0);

/// True if p[0, n) equals what Fill(p, n, seed, offset) writes.
bool CheckFill(const std::byte* p, size_t n, uint64_t seed, uint64_t offset = 0);

/// The seed of an array's bytes: a hash of its name.
uint64_t NameSeed(const std::string& name);

/// One global array of a model.
struct ArraySpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  ///< empty for a scalar
  /// Split by rows (the first dimension) over the ranks when it has at least
  /// as many rows as there are ranks; otherwise, and when false, every rank
  /// holds it whole.
  bool shard = false;
  /// Held whole by one rank only (which one: Holders); `shard` is ignored.
  bool one_holder = false;
};

/// For each of `specs`, the one rank holding it (ArraySpec::one_holder), or
/// -1 when every rank holds a box of it. One-holder arrays go in order to the
/// rank with the fewest of their bytes so far (ties: the lowest rank), so the
/// ranks' shares differ by at most one array.
std::vector<int> Holders(const std::vector<ArraySpec>& specs, int size);

/// True if `a` is split over `size` ranks (see ArraySpec::shard).
bool IsSharded(const ArraySpec& a, int size);
/// The box rank `rank` of `size` holds: rows [rows*rank/size, rows*(rank+1)/size)
/// if sharded, else the whole array.
Box LocalBox(const ArraySpec& a, int rank, int size);
/// Bytes of one row (the whole array for a scalar).
uint64_t RowBytes(const ArraySpec& a);
/// Bytes of the whole array.
uint64_t ArrayBytes(const ArraySpec& a);

/// The training state of docs/PERFORMANCE.md: bf16 parameters, fp32 master
/// weights and Adam moments (14 bytes per parameter) as 8 arrays of
/// [rows, 4096] sharded by rows, about `mib` MiB together, plus `small` norms
/// of 16 KiB, a step counter and an RNG state that every rank holds whole.
/// With `replicate_all`, every array is held whole by every rank (pure data
/// parallel: `mib` MiB per rank).
struct TrainingStateConfig {
  double mib = 256;
  int small = 64;
  bool replicate_all = false;
};
std::vector<ArraySpec> TrainingStateSpecs(const TrainingStateConfig& c, int size);

/// A transformer-like mix of about `arrays` arrays (10,000: exactly), about
/// `mib` MiB together: layers of 16 tensors (attention and MLP weights of a
/// few shapes, their biases, two layer norms; 156 layers for 10,000 arrays),
/// a token and a position embedding and a final norm, each tensor as bf16
/// parameters plus fp32 master, Adam m and v. The layers hold about 70% of the
/// bytes. The two embeddings are sharded by rows; every other array is held
/// whole by one rank (ArraySpec::one_holder), as a model-parallel layout
/// puts a small tensor on one rank.
inline constexpr int kManySmallArrays = 10000;
std::vector<ArraySpec> ManySmallSpecs(double mib, int arrays = kManySmallArrays);

/// One uint8 array of `bytes` bytes, sharded.
std::vector<ArraySpec> OneArraySpecs(uint64_t bytes);

/// A model as one rank holds it: its boxes of every array, filled.
struct Model {
  std::vector<ArraySpec> specs;
  std::vector<ArrayToSave> arrays;
  std::vector<ArrayToSave> arrays_with_extra;  ///< one more tiny array: a new plan
  std::vector<std::unique_ptr<std::byte[]>> buffers;
  std::vector<std::pair<const std::byte*, size_t>> boxes;  ///< every local box, in order
  uint64_t local_bytes = 0;
  uint64_t replicated_bytes = 0;  ///< of local_bytes: arrays this rank holds whole
  uint64_t global_bytes = 0;
  int large_arrays = 0;  ///< sharded over the ranks
  int small_arrays = 0;  ///< held whole (by this rank or, one_holder, by one rank)
};

/// Allocates and fills rank `rank`'s boxes of `specs` (laid out for `size`
/// ranks), and the array list with one extra tiny array.
Model Materialize(std::vector<ArraySpec> specs, int rank, int size);

/// The training state (TrainingStateSpecs), materialized for `rank`.
Model BuildModel(const TrainingStateConfig& c, int rank, int size);

/// Buffers for a restore of `specs` laid out for `size` ranks. With `touch`,
/// every page is written once; without, the buffers are fresh allocations
/// whose pages the restore touches first (as a framework's new arrays are).
/// With `huge_pages`, a buffer of 4 MiB or more is advised MADV_HUGEPAGE over
/// its whole pages, exactly as numpy advises its new arrays (so that mhckpt's
/// C++ restores land in the same kind of memory as h5py's and mhckpt-py's).
/// Each buffer's data starts on a page boundary, as the arrays mhckpt-py
/// makes for a restore do (its reads can go straight from the disk).
struct Destinations {
  std::vector<ArraySpec> specs;
  std::vector<ArrayToRestore> arrays;
  std::vector<std::unique_ptr<std::byte[]>> buffers;  ///< the allocations
  std::vector<std::byte*> data;                       ///< in them, page-aligned
  std::vector<Box> boxes;
  std::vector<size_t> bytes;  ///< 0 where another rank holds the array (one_holder)
  uint64_t local_bytes = 0;

  /// Overwrites every buffer with `value` (so that a restore that writes
  /// nothing fails verification).
  void Scrub(std::byte value);
  /// Checks every buffer against the model's bytes. Returns the number of
  /// arrays that differ; `first_bad` gets the name of the first.
  int Verify(std::string* first_bad) const;
};
Destinations AllocateDestinations(std::vector<ArraySpec> specs, int rank, int size,
                                  bool touch = true, bool huge_pages = false);

}  // namespace mhckpt::bench
