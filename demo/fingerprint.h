// A hash of a whole checkpointed state that does not depend on the world
// size or on how the arrays are sharded, so that a state saved at 4 ranks and
// restored at 3 can be compared by one printed number.
//
//   fingerprint = sum over every element e of every array (mod 2^64) of
//     SplitMix64(Fnv1a64(name) + SplitMix64(index(e) + SplitMix64(value(e))))
//
// where index(e) is the element's row-major linear index in the global array
// (0 for a 0-d array) and value(e) its bytes read as a little-endian unsigned
// integer (zero-extended to 64 bits). Addition makes it independent of the
// order in which ranks and boxes are visited; tests/demo_test.py recomputes it
// from data.h5 with numpy.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "worker/array.h"

namespace mhckpt::demo {

/// 64-bit FNV-1a of `s`.
uint64_t Fnv1a64(std::string_view s);

/// The term of one element (see the top of this file).
uint64_t ElementHash(uint64_t name_hash, uint64_t index, uint64_t value);

/// This rank's share of the fingerprint of `arrays`. Boxes of one array held
/// by different ranks must not overlap, except replicas: a shard covering the
/// whole array counts on rank 0 only, so rank 0 must hold every replicated
/// array. Local.
uint64_t LocalFingerprint(std::span<const ArrayToSave> arrays, int rank);

/// Collective over `comm`: the sum of LocalFingerprint over ranks.
uint64_t GlobalFingerprint(std::span<const ArrayToSave> arrays, MPI_Comm comm);

/// 16 lowercase hex digits.
std::string FingerprintHex(uint64_t fingerprint);

}  // namespace mhckpt::demo
