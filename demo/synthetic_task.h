// The demo's data: a regression task whose targets come from a fixed random
// "teacher" network. Every input is a function of (seed, batch key, global
// sample index), so every world size sees the same global batch.
#pragma once

#include <cstdint>
#include <vector>

namespace mhckpt::demo {

class SyntheticTask {
 public:
  /// A teacher in -> hidden (tanh) -> out, its weights drawn from `seed`.
  SyntheticTask(uint64_t seed, int64_t in, int64_t hidden, int64_t out);

  /// Samples [begin, end) of the global batch drawn with `key`: inputs
  /// uniform in [-1, 1) into `x` [end - begin, in], the teacher's outputs into
  /// `y` [end - begin, out].
  void MakeBatch(uint64_t key, int64_t begin, int64_t end, std::vector<float>* x,
                 std::vector<float>* y) const;

 private:
  int64_t in_, hidden_, out_;
  std::vector<float> w1_, b1_, w2_;  // [hidden, in], [hidden], [out, hidden]
};

}  // namespace mhckpt::demo
