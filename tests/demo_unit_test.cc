// Unit tests of the demo's pieces: the MLP's gradients against finite
// differences, and the fingerprint's independence of sharding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "demo/fingerprint.h"
#include "demo/mlp.h"
#include "demo/rng.h"
#include "demo/synthetic_task.h"

namespace mhckpt::demo {
namespace {

TEST(Mlp, GradientsMatchFiniteDifferences) {
  Mlp mlp({5, 7, 6, 3});
  std::vector<float> params(mlp.num_params());
  for (size_t i = 0; i < params.size(); ++i) params[i] = 0.5f * UniformFloat(SplitMix64(i));
  SyntheticTask task(3, 5, 4, 3);
  std::vector<float> x, y;
  task.MakeBatch(11, 0, 4, &x, &y);
  std::vector<float> grads(params.size(), 0.0f);
  const double sse = mlp.AccumulateGradients(params, x.data(), y.data(), 4, 1.0f, grads);
  EXPECT_GT(sse, 0);

  // Central differences of the sum of squared errors, in double around float params.
  int checked = 0;
  for (size_t i = 0; i < params.size(); i += 3) {
    const float saved = params[i], h = 1e-2f;
    std::vector<float> scratch(params.size());
    params[i] = saved + h;
    const double up = mlp.AccumulateGradients(params, x.data(), y.data(), 4, 0.0f, scratch);
    params[i] = saved - h;
    const double down = mlp.AccumulateGradients(params, x.data(), y.data(), 4, 0.0f, scratch);
    params[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

TEST(Mlp, GradientsAccumulateAcrossBatchSlices) {
  // Two halves of a batch give the gradient of the whole: what the allreduce relies on.
  Mlp mlp({4, 6, 2});
  std::vector<float> params(mlp.num_params());
  for (size_t i = 0; i < params.size(); ++i) params[i] = UniformFloat(SplitMix64(100 + i));
  SyntheticTask task(5, 4, 3, 2);
  std::vector<float> x, y, x1, y1, x2, y2;
  task.MakeBatch(7, 0, 6, &x, &y);
  task.MakeBatch(7, 0, 2, &x1, &y1);
  task.MakeBatch(7, 2, 6, &x2, &y2);
  EXPECT_EQ(std::vector<float>(x.begin() + 8, x.end()), x2) << "samples depend on index only";
  std::vector<float> whole(params.size(), 0.0f), parts(params.size(), 0.0f);
  const double sse = mlp.AccumulateGradients(params, x.data(), y.data(), 6, 1.0f, whole);
  const double sse1 = mlp.AccumulateGradients(params, x1.data(), y1.data(), 2, 1.0f, parts);
  const double sse2 = mlp.AccumulateGradients(params, x2.data(), y2.data(), 4, 1.0f, parts);
  EXPECT_NEAR(sse, sse1 + sse2, 1e-9 * sse);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(whole[i], parts[i], 1e-5) << i;
}

TEST(Fingerprint, IndependentOfShardingAndCountsReplicasOnce) {
  const std::vector<int64_t> shape{5, 3};
  std::vector<float> values(15);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  int64_t step = 42;
  auto whole = [&] {
    return std::vector<ArrayToSave>{
        {"w", DType::kFloat32, shape, {Shard{FullBox(shape), values.data()}}},
        {"step", DType::kInt64, {}, {Shard{Box{}, &step}}}};
  };
  const uint64_t one_rank = LocalFingerprint(whole(), 0);

  // Three ranks: rows 0-1, rows 2-4 split into two column boxes; step replicated.
  std::vector<float> r0(values.begin(), values.begin() + 6);
  std::vector<float> r1a, r1b;
  for (int row = 2; row < 5; ++row) {
    r1a.push_back(values[static_cast<size_t>(row * 3)]);
    r1b.push_back(values[static_cast<size_t>(row * 3 + 1)]);
    r1b.push_back(values[static_cast<size_t>(row * 3 + 2)]);
  }
  std::vector<ArrayToSave> rank0{
      {"w", DType::kFloat32, shape, {Shard{Box{{0, 0}, {2, 3}}, r0.data()}}},
      {"step", DType::kInt64, {}, {Shard{Box{}, &step}}}};
  std::vector<ArrayToSave> rank1{
      {"w", DType::kFloat32, shape, {Shard{Box{{2, 0}, {3, 1}}, r1a.data()}}},
      {"step", DType::kInt64, {}, {Shard{Box{}, &step}}}};
  std::vector<ArrayToSave> rank2{
      {"w", DType::kFloat32, shape, {Shard{Box{{2, 1}, {3, 2}}, r1b.data()}}},
      {"step", DType::kInt64, {}, {Shard{Box{}, &step}}}};
  const uint64_t three_ranks =
      LocalFingerprint(rank0, 0) + LocalFingerprint(rank1, 1) + LocalFingerprint(rank2, 2);
  EXPECT_EQ(one_rank, three_ranks);

  // Any changed element, or a renamed array, changes it.
  values[7] = -1.0f;
  EXPECT_NE(LocalFingerprint(whole(), 0), one_rank);
  values[7] = 3.5f;
  EXPECT_EQ(LocalFingerprint(whole(), 0), one_rank);
  step = 43;
  EXPECT_NE(LocalFingerprint(whole(), 0), one_rank);
  step = 42;
  auto renamed = whole();
  renamed[0].name = "w2";
  EXPECT_NE(LocalFingerprint(renamed, 0), one_rank);
  // The documented formula, for one element.
  EXPECT_EQ(ElementHash(Fnv1a64("step"), 0, 42),
            SplitMix64(Fnv1a64("step") + SplitMix64(0 + SplitMix64(42))));
}

}  // namespace
}  // namespace mhckpt::demo
