#include "demo/mlp.h"

#include <algorithm>

namespace mhckpt::demo {
namespace {

// Dot product with eight independent partial sums, which the compiler keeps
// in vector registers.
float Dot(const float* a, const float* b, int64_t n) {
  float part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) part[k] += a[i + k] * b[i + k];
  }
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (float p : part) sum += p;
  return sum;
}

// y[0:n] += alpha * x[0:n]
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace

Mlp::Mlp(std::vector<int64_t> widths) : widths_(std::move(widths)) {
  for (int l = 0; l < num_layers(); ++l) {
    w_offset_.push_back(num_params_);
    num_params_ += static_cast<size_t>(rows(l) * cols(l));
    b_offset_.push_back(num_params_);
    num_params_ += static_cast<size_t>(rows(l));
  }
  act_.resize(widths_.size());
  delta_.resize(widths_.size());
}

double Mlp::AccumulateGradients(std::span<const float> params, const float* x, const float* y,
                                int64_t n, float scale, std::span<float> grads) {
  const int layers = num_layers();
  // Forward. act_[l] holds the input of layer l ([n, widths[l]]); act_[layers]
  // the output. Hidden activations are stored after the ReLU.
  act_[0].assign(x, x + n * widths_[0]);
  for (int l = 0; l < layers; ++l) {
    const int64_t out = rows(l), in = cols(l);
    const float* w = params.data() + w_offset_[l];
    const float* b = params.data() + b_offset_[l];
    std::vector<float>& next = act_[l + 1];
    next.resize(static_cast<size_t>(n * out));
    const bool relu = l + 1 < layers;
    // Row of W outer, samples inner: each row of W is read from memory once.
    for (int64_t o = 0; o < out; ++o) {
      const float* wo = w + o * in;
      for (int64_t s = 0; s < n; ++s) {
        float z = Dot(act_[l].data() + s * in, wo, in) + b[o];
        next[static_cast<size_t>(s * out + o)] = relu ? std::max(z, 0.0f) : z;
      }
    }
  }

  // Loss and its gradient at the output.
  const int64_t out_width = widths_.back();
  std::vector<float>& d_out = delta_[layers];
  d_out.resize(static_cast<size_t>(n * out_width));
  double sse = 0;
  for (int64_t i = 0; i < n * out_width; ++i) {
    float err = act_[layers][static_cast<size_t>(i)] - y[i];
    sse += static_cast<double>(err) * err;
    d_out[static_cast<size_t>(i)] = 2.0f * err * scale;
  }

  // Backward. delta_[l+1] is d(loss)/d(pre-activation of layer l's output).
  for (int l = layers - 1; l >= 0; --l) {
    const int64_t out = rows(l), in = cols(l);
    const float* w = params.data() + w_offset_[l];
    float* gw = grads.data() + w_offset_[l];
    float* gb = grads.data() + b_offset_[l];
    const std::vector<float>& d = delta_[l + 1];
    std::vector<float>& d_in = delta_[l];
    const bool need_input_grad = l > 0;
    if (need_input_grad) d_in.assign(static_cast<size_t>(n * in), 0.0f);
    for (int64_t o = 0; o < out; ++o) {
      const float* wo = w + o * in;
      float* gwo = gw + o * in;
      for (int64_t s = 0; s < n; ++s) {
        const float g = d[static_cast<size_t>(s * out + o)];
        if (g == 0.0f) continue;  // a ReLU that was off: nothing flows
        gb[o] += g;
        Axpy(g, act_[l].data() + s * in, gwo, in);
        if (need_input_grad) Axpy(g, wo, d_in.data() + s * in, in);
      }
    }
    if (need_input_grad) {  // through the ReLU that produced act_[l]
      for (size_t i = 0; i < d_in.size(); ++i) {
        if (act_[l][i] <= 0.0f) d_in[i] = 0.0f;
      }
    }
  }
  return sse;
}

}  // namespace mhckpt::demo
