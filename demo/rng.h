// Deterministic random numbers for the demo: a stateless 64-bit mixer (for
// values keyed by an index, the same on every world size) and a small
// generator whose state is part of the checkpoint.
#pragma once

#include <array>
#include <cstdint>

namespace mhckpt::demo {

/// The SplitMix64 output function: a bijective 64-bit mixer.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A float uniform in [-1, 1), from the top 24 bits of `bits`.
inline float UniformFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/// xoshiro256** (Blackman and Vigna). The four words of state are public so
/// that the training loop can checkpoint them as a uint64 array.
struct Xoshiro256 {
  std::array<uint64_t, 4> state{};

  /// A generator seeded by expanding `seed` with SplitMix64.
  static Xoshiro256 FromSeed(uint64_t seed) {
    Xoshiro256 g;
    for (size_t i = 0; i < g.state.size(); ++i) g.state[i] = SplitMix64(seed + i);
    return g;
  }

  uint64_t Next() {
    auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
    const uint64_t result = rotl(state[1] * 5, 7) * 9;
    const uint64_t t = state[1] << 17;
    state[2] ^= state[0];
    state[3] ^= state[1];
    state[1] ^= state[2];
    state[0] ^= state[3];
    state[2] ^= t;
    state[3] = rotl(state[3], 45);
    return result;
  }
};

}  // namespace mhckpt::demo
