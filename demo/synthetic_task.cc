#include "demo/synthetic_task.h"

#include <cmath>

#include "demo/rng.h"

namespace mhckpt::demo {
namespace {

// Element `index` of a random tensor named by `tag`, uniform in [-scale, scale).
float Draw(uint64_t seed, uint64_t tag, uint64_t index, float scale) {
  return scale * UniformFloat(SplitMix64(SplitMix64(seed ^ (tag << 56)) + index));
}

}  // namespace

SyntheticTask::SyntheticTask(uint64_t seed, int64_t in, int64_t hidden, int64_t out)
    : in_(in), hidden_(hidden), out_(out) {
  // Scales keep the hidden pre-activations and the targets of order one.
  const float s1 = std::sqrt(6.0f / static_cast<float>(in));
  const float s2 = std::sqrt(6.0f / static_cast<float>(hidden));
  for (int64_t i = 0; i < hidden * in; ++i) w1_.push_back(Draw(seed, 1, i, s1));
  for (int64_t i = 0; i < hidden; ++i) b1_.push_back(Draw(seed, 2, i, 0.5f));
  for (int64_t i = 0; i < out * hidden; ++i) w2_.push_back(Draw(seed, 3, i, s2));
}

void SyntheticTask::MakeBatch(uint64_t key, int64_t begin, int64_t end, std::vector<float>* x,
                              std::vector<float>* y) const {
  const int64_t n = end - begin;
  x->resize(static_cast<size_t>(n * in_));
  y->resize(static_cast<size_t>(n * out_));
  std::vector<float> h(static_cast<size_t>(hidden_));
  for (int64_t s = 0; s < n; ++s) {
    float* xs = x->data() + s * in_;
    const uint64_t sample_key = SplitMix64(key + static_cast<uint64_t>(begin + s));
    for (int64_t i = 0; i < in_; ++i) {
      xs[i] = UniformFloat(SplitMix64(sample_key + static_cast<uint64_t>(i)));
    }
    for (int64_t j = 0; j < hidden_; ++j) {
      float z = b1_[static_cast<size_t>(j)];
      for (int64_t i = 0; i < in_; ++i) z += w1_[static_cast<size_t>(j * in_ + i)] * xs[i];
      h[static_cast<size_t>(j)] = std::tanh(z);
    }
    for (int64_t o = 0; o < out_; ++o) {
      float t = 0;
      for (int64_t j = 0; j < hidden_; ++j) {
        t += w2_[static_cast<size_t>(o * hidden_ + j)] * h[static_cast<size_t>(j)];
      }
      (*y)[static_cast<size_t>(s * out_ + o)] = t;
    }
  }
}

}  // namespace mhckpt::demo
