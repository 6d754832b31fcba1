// The demo's training state on one rank, sharded the way a large model's is:
// every weight matrix and its Adam moments (m, v) are split by rows across
// the ranks (unevenly when the rows do not divide), while biases, their
// moments, the step counter and the RNG state are small replicated arrays.
//
// One training step is data-parallel with a sharded optimizer: each rank
// runs its slice of the global batch through the full weights, one
// MPI_Allreduce sums the gradients, each rank applies Adam to the rows it
// owns, and MPI_Allgatherv brings every rank the updated full weights.
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "demo/mlp.h"
#include "demo/rng.h"
#include "demo/synthetic_task.h"
#include "worker/array.h"

namespace mhckpt::demo {

/// What defines a run. Saved with the checkpoint (as the array
/// "config/model"), so that a resume rebuilds the same model.
struct ModelConfig {
  uint64_t seed = 1;
  int64_t global_batch = 64;
  int64_t input_width = 64;
  int64_t hidden_width = 256;
  int64_t hidden_layers = 2;  ///< weight matrices: hidden_layers + 1
  int64_t output_width = 10;
  int64_t teacher_width = 32;

  /// The config with the largest hidden width whose sharded state (weights,
  /// Adam m and v, as float32) fits in `mib` MiB.
  static ModelConfig ForStateSize(double mib, uint64_t seed, int64_t global_batch);
  /// Why this config cannot be trained, or OK.
  [[nodiscard]] Status Validate() const;
  [[nodiscard]] std::vector<int64_t> Widths() const;
  /// Bytes of the sharded arrays: weight matrices and their Adam moments.
  [[nodiscard]] uint64_t ShardedStateBytes() const;
  /// "64-1409-1409-10".
  [[nodiscard]] std::string Describe() const;

  /// The config as stored in the checkpoint, and back.
  static constexpr int kEncodedSize = 8;
  [[nodiscard]] std::array<int64_t, kEncodedSize> Encode() const;
  static Result<ModelConfig> Decode(const std::array<int64_t, kEncodedSize>& encoded);
};

/// Name of the array that holds ModelConfig::Encode().
inline constexpr const char* kConfigArrayName = "config/model";

class Trainer {
 public:
  /// A fresh state at step 0 for this rank of `comm` (not collective).
  Trainer(const ModelConfig& config, float learning_rate, MPI_Comm comm);

  /// Collective. One optimizer step over the next global batch; returns the
  /// batch's mean squared error (before the update). Overwrites every array.
  double Step();

  /// Every array of the state, pointing at this rank's live buffers: its own
  /// rows of each sharded array, and the whole of each replicated one.
  [[nodiscard]] std::vector<ArrayToSave> ArraysToSave() const;
  /// The same arrays as restore requests: this rank's rows under the current
  /// world size, and the whole of each replicated array.
  std::vector<ArrayToRestore> ArraysToRestore();
  /// Collective. After a restore into ArraysToRestore(): rebuilds the full
  /// weights every rank computes with from the restored rows, and checks that
  /// the restored config is this trainer's.
  Status FinishRestore();

  [[nodiscard]] int64_t step() const { return step_; }
  [[nodiscard]] const Mlp& mlp() const { return mlp_; }
  [[nodiscard]] const ModelConfig& config() const { return config_; }

 private:
  // Rows [begin, end) of weight matrix `layer` owned by this rank.
  [[nodiscard]] std::pair<int64_t, int64_t> OwnedRows(int layer) const;
  void InitParams();
  void AllgatherWeights();
  void AdamUpdate(float* param, float* m, float* v, const float* grad, size_t n) const;

  ModelConfig config_;
  float learning_rate_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  Mlp mlp_;
  SyntheticTask task_;

  // Full parameters (Mlp layout), identical on every rank after each step; a
  // rank's own rows of each W are the ones it saves.
  std::vector<float> params_;
  std::vector<float> grads_;                   // Mlp layout, plus one slot for the loss
  std::vector<std::vector<float>> m_w_, v_w_;  // own rows of each W
  std::vector<std::vector<float>> m_b_, v_b_;  // whole biases
  int64_t step_ = 0;
  Xoshiro256 rng_;
  std::array<int64_t, ModelConfig::kEncodedSize> config_array_{};
  std::vector<float> x_, y_;  // this rank's slice of the batch
};

}  // namespace mhckpt::demo
