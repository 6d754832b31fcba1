// The demo's model: a multi-layer perceptron with ReLU hidden layers and a
// linear output, trained on mean squared error. Pure computation on one rank;
// sharding and MPI live in demo/trainer.h.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mhckpt::demo {

/// The weights of layer l are a [widths[l+1], widths[l]] row-major matrix W
/// (one row per output unit) and a [widths[l+1]] bias b: y = W x + b.
/// Every parameter lives in one flat float vector, layer by layer, W then b,
/// so that one MPI_Allreduce reduces every gradient.
class Mlp {
 public:
  /// `widths`: input width, hidden widths..., output width (at least two).
  explicit Mlp(std::vector<int64_t> widths);

  [[nodiscard]] const std::vector<int64_t>& widths() const { return widths_; }
  [[nodiscard]] int num_layers() const { return static_cast<int>(widths_.size()) - 1; }
  [[nodiscard]] int64_t rows(int layer) const { return widths_[layer + 1]; }
  [[nodiscard]] int64_t cols(int layer) const { return widths_[layer]; }
  /// Offsets into the flat parameter vector.
  [[nodiscard]] size_t w_offset(int layer) const { return w_offset_[layer]; }
  [[nodiscard]] size_t b_offset(int layer) const { return b_offset_[layer]; }
  /// Number of floats in the flat parameter vector.
  [[nodiscard]] size_t num_params() const { return num_params_; }

  /// Forward and backward pass over `n` samples: inputs `x` [n, widths[0]],
  /// targets `y` [n, widths.back()]. Adds `scale` * d(sum of squared
  /// errors)/d(params) into `grads` (same layout as `params`) and returns the
  /// sum of squared errors.
  double AccumulateGradients(std::span<const float> params, const float* x, const float* y,
                             int64_t n, float scale, std::span<float> grads);

 private:
  std::vector<int64_t> widths_;
  std::vector<size_t> w_offset_, b_offset_;
  size_t num_params_ = 0;
  // Per layer boundary: pre-activations kept for the backward pass (reused).
  std::vector<std::vector<float>> act_;
  std::vector<std::vector<float>> delta_;
};

}  // namespace mhckpt::demo
