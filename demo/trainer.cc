#include "demo/trainer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace mhckpt::demo {
namespace {

constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEpsilon = 1e-8f;
constexpr int64_t kConfigVersion = 1;

// A replicated array: one shard, the whole array.
ArrayToSave Replicated(std::string name, DType dtype, std::vector<int64_t> shape,
                       const void* data) {
  Box box = FullBox(shape);
  return ArrayToSave{std::move(name), dtype, std::move(shape), {Shard{std::move(box), data}}};
}

std::string LayerName(const char* prefix, int layer, const char* leaf) {
  return fmt::format("{}/layer{}/{}", prefix, layer, leaf);
}

}  // namespace

ModelConfig ModelConfig::ForStateSize(double mib, uint64_t seed, int64_t global_batch) {
  ModelConfig c;
  c.seed = seed;
  c.global_batch = global_batch;
  // Floats per sharded array set: a*H^2 + b*H, times 3 arrays of 4 bytes.
  const double a = static_cast<double>(c.hidden_layers - 1);
  const double b = static_cast<double>(c.input_width + c.output_width);
  const double floats = mib * 1024 * 1024 / 12;
  const double h = a > 0 ? (-b + std::sqrt(b * b + 4 * a * floats)) / (2 * a) : floats / b;
  c.hidden_width = std::max<int64_t>(1, static_cast<int64_t>(h));
  return c;
}

Status ModelConfig::Validate() const {
  if (global_batch < 1 || input_width < 1 || hidden_width < 1 || output_width < 1 ||
      teacher_width < 1) {
    return InvalidArgument(
        fmt::format("model config {} batch {}: sizes must be positive", Describe(), global_batch));
  }
  if (hidden_layers < 1 || hidden_layers > 16) {
    return InvalidArgument(fmt::format("model config: {} hidden layers (1 to 16)", hidden_layers));
  }
  // MPI counts are ints: every matrix and the gradient vector must fit.
  const double params = static_cast<double>(ShardedStateBytes()) / 12;
  if (params > static_cast<double>(std::numeric_limits<int>::max()) / 2) {
    return InvalidArgument(fmt::format("model config {}: too large for this demo", Describe()));
  }
  return OkStatus();
}

std::vector<int64_t> ModelConfig::Widths() const {
  std::vector<int64_t> w{input_width};
  for (int64_t i = 0; i < hidden_layers; ++i) w.push_back(hidden_width);
  w.push_back(output_width);
  return w;
}

uint64_t ModelConfig::ShardedStateBytes() const {
  std::vector<int64_t> w = Widths();
  uint64_t floats = 0;
  for (size_t l = 0; l + 1 < w.size(); ++l) floats += static_cast<uint64_t>(w[l] * w[l + 1]);
  return 3 * 4 * floats;
}

std::string ModelConfig::Describe() const { return fmt::format("{}", fmt::join(Widths(), "-")); }

std::array<int64_t, ModelConfig::kEncodedSize> ModelConfig::Encode() const {
  int64_t seed_bits = 0;
  std::memcpy(&seed_bits, &seed, sizeof(seed));
  return {kConfigVersion, seed_bits,     global_batch, input_width,
          hidden_width,   hidden_layers, output_width, teacher_width};
}

Result<ModelConfig> ModelConfig::Decode(const std::array<int64_t, kEncodedSize>& e) {
  if (e[0] != kConfigVersion) {
    return InvalidArgument(fmt::format("array '{}': unknown config version {} (this demo reads {})",
                                       kConfigArrayName, e[0], kConfigVersion));
  }
  ModelConfig c;
  std::memcpy(&c.seed, &e[1], sizeof(c.seed));
  c.global_batch = e[2];
  c.input_width = e[3];
  c.hidden_width = e[4];
  c.hidden_layers = e[5];
  c.output_width = e[6];
  c.teacher_width = e[7];
  MHCKPT_RETURN_IF_ERROR(c.Validate());
  return c;
}

Trainer::Trainer(const ModelConfig& config, float learning_rate, MPI_Comm comm)
    : config_(config),
      learning_rate_(learning_rate),
      comm_(comm),
      mlp_(config.Widths()),
      task_(config.seed, config.input_width, config.teacher_width, config.output_width),
      rng_(Xoshiro256::FromSeed(config.seed ^ 0x5eedda7aULL)),
      config_array_(config.Encode()) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  params_.resize(mlp_.num_params());
  grads_.resize(mlp_.num_params() + 1);
  for (int l = 0; l < mlp_.num_layers(); ++l) {
    auto [begin, end] = OwnedRows(l);
    const size_t owned = static_cast<size_t>((end - begin) * mlp_.cols(l));
    m_w_.emplace_back(owned, 0.0f);
    v_w_.emplace_back(owned, 0.0f);
    m_b_.emplace_back(static_cast<size_t>(mlp_.rows(l)), 0.0f);
    v_b_.emplace_back(static_cast<size_t>(mlp_.rows(l)), 0.0f);
  }
  InitParams();
}

std::pair<int64_t, int64_t> Trainer::OwnedRows(int layer) const {
  return SplitRange(mlp_.rows(layer), size_, rank_);
}

void Trainer::InitParams() {
  // He-uniform weights keyed by their global index (the same on any world
  // size), zero biases.
  for (int l = 0; l < mlp_.num_layers(); ++l) {
    const float fan_in = static_cast<float>(mlp_.cols(l));
    const float scale = std::sqrt((l + 1 < mlp_.num_layers() ? 6.0f : 3.0f) / fan_in);
    const uint64_t tag = SplitMix64(config_.seed + 1000 + static_cast<uint64_t>(l));
    float* w = params_.data() + mlp_.w_offset(l);
    const int64_t n = mlp_.rows(l) * mlp_.cols(l);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = scale * UniformFloat(SplitMix64(tag + static_cast<uint64_t>(i)));
    }
  }
}

void Trainer::AllgatherWeights() {
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  for (int l = 0; l < mlp_.num_layers(); ++l) {
    for (int r = 0; r < size_; ++r) {
      auto [begin, end] = SplitRange(mlp_.rows(l), size_, r);
      counts[static_cast<size_t>(r)] = static_cast<int>((end - begin) * mlp_.cols(l));
      displs[static_cast<size_t>(r)] = static_cast<int>(begin * mlp_.cols(l));
    }
    // Why: every rank computes with the full weights, and owns only its rows.
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params_.data() + mlp_.w_offset(l),
                   counts.data(), displs.data(), MPI_FLOAT, comm_);
  }
}

void Trainer::AdamUpdate(float* param, float* m, float* v, const float* grad, size_t n) const {
  const double t = static_cast<double>(step_);
  const float c1 = static_cast<float>(1 - std::pow(kBeta1, t));
  const float c2 = static_cast<float>(1 - std::pow(kBeta2, t));
  for (size_t i = 0; i < n; ++i) {
    m[i] = kBeta1 * m[i] + (1 - kBeta1) * grad[i];
    v[i] = kBeta2 * v[i] + (1 - kBeta2) * grad[i] * grad[i];
    param[i] -= learning_rate_ * (m[i] / c1) / (std::sqrt(v[i] / c2) + kEpsilon);
  }
}

double Trainer::Step() {
  const uint64_t key = rng_.Next();
  auto [begin, end] = SplitRange(config_.global_batch, size_, rank_);
  task_.MakeBatch(key, begin, end, &x_, &y_);
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  const double outputs = static_cast<double>(config_.global_batch * config_.output_width);
  const double sse = mlp_.AccumulateGradients(params_, x_.data(), y_.data(), end - begin,
                                              static_cast<float>(1 / outputs),
                                              std::span<float>(grads_.data(), mlp_.num_params()));
  grads_.back() = static_cast<float>(sse / outputs);
  // Why: the gradient of the global batch is the sum of every rank's part;
  // the loss rides along in the last slot.
  MPI_Allreduce(MPI_IN_PLACE, grads_.data(), static_cast<int>(grads_.size()), MPI_FLOAT, MPI_SUM,
                comm_);

  ++step_;
  for (int l = 0; l < mlp_.num_layers(); ++l) {
    auto [r0, r1] = OwnedRows(l);
    const size_t first = mlp_.w_offset(l) + static_cast<size_t>(r0 * mlp_.cols(l));
    AdamUpdate(params_.data() + first, m_w_[l].data(), v_w_[l].data(), grads_.data() + first,
               m_w_[l].size());
    // Biases are replicated: every rank applies the same reduced gradient.
    AdamUpdate(params_.data() + mlp_.b_offset(l), m_b_[l].data(), v_b_[l].data(),
               grads_.data() + mlp_.b_offset(l), m_b_[l].size());
  }
  AllgatherWeights();
  return grads_.back();
}

std::vector<ArrayToSave> Trainer::ArraysToSave() const {
  std::vector<ArrayToSave> arrays;
  for (int l = 0; l < mlp_.num_layers(); ++l) {
    const int64_t rows = mlp_.rows(l), cols = mlp_.cols(l);
    auto [r0, r1] = OwnedRows(l);
    auto sharded = [&, r0 = r0, r1 = r1](std::string name, const float* data) {
      ArrayToSave a{std::move(name), DType::kFloat32, {rows, cols}, {}};
      if (r1 > r0) a.shards.push_back(Shard{Box{{r0, 0}, {r1 - r0, cols}}, data});
      arrays.push_back(std::move(a));
    };
    sharded(LayerName("model", l, "w"), params_.data() + mlp_.w_offset(l) + r0 * cols);
    sharded(LayerName("optimizer/adam_m", l, "w"), m_w_[l].data());
    sharded(LayerName("optimizer/adam_v", l, "w"), v_w_[l].data());
    arrays.push_back(Replicated(LayerName("model", l, "b"), DType::kFloat32, {rows},
                                params_.data() + mlp_.b_offset(l)));
    arrays.push_back(
        Replicated(LayerName("optimizer/adam_m", l, "b"), DType::kFloat32, {rows}, m_b_[l].data()));
    arrays.push_back(
        Replicated(LayerName("optimizer/adam_v", l, "b"), DType::kFloat32, {rows}, v_b_[l].data()));
  }
  arrays.push_back(Replicated("train/step", DType::kInt64, {}, &step_));
  arrays.push_back(Replicated("train/rng", DType::kUInt64,
                              {static_cast<int64_t>(rng_.state.size())}, rng_.state.data()));
  arrays.push_back(Replicated(kConfigArrayName, DType::kInt64,
                              {static_cast<int64_t>(config_array_.size())}, config_array_.data()));
  return arrays;
}

std::vector<ArrayToRestore> Trainer::ArraysToRestore() {
  std::vector<ArrayToRestore> requests;
  // Same names, dtypes and boxes as ArraysToSave, at this world size.
  for (const ArrayToSave& a : ArraysToSave()) {
    ArrayToRestore r{a.name, a.dtype, {}};
    for (const Shard& s : a.shards) {
      r.shards.push_back(Destination{s.box, const_cast<void*>(s.data)});  // NOLINT: our buffers
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

Status Trainer::FinishRestore() {
  if (config_array_ != config_.Encode()) {
    return InvalidArgument(
        fmt::format("array '{}': restored config differs from the one given", kConfigArrayName));
  }
  AllgatherWeights();
  return OkStatus();
}

}  // namespace mhckpt::demo
