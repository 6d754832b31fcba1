// The bug mhckpt exists to prevent, as a regression test.
//
// A training-like loop mixes sharded arrays with small fully replicated ones
// (the arrays that took Orbax's "aggregate" path and were serialized after
// their buffers were donated), calls Save, and at once overwrites and frees
// every buffer it passed. The restored checkpoint must equal the values at the
// time of the call, bit for bit. Under AddressSanitizer (scripts/test.sh
// builds build-address/) any later read of a freed buffer aborts the test;
// under ThreadSanitizer (build-thread/) the I/O thread's sharing is checked.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "coordinator/checkpoint_manager.h"
#include "tests/test_util.h"

namespace mhckpt {
namespace {

using testing::Fill;
using testing::FreshDir;
using testing::OpenForTest;
using testing::Rank;
using testing::Size;

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool sharded;  // rows split over ranks; otherwise a full replica on every rank
};

std::vector<Spec> Model(int p) {
  return {
      {"params/w1", DType::kFloat32, {256 * p + 3, 64}, true},
      {"opt/m/w1", DType::kBFloat16, {256 * p + 3, 64}, true},
      {"params/b1", DType::kFloat32, {64}, false},
      {"params/norm_scale", DType::kFloat16, {64}, false},
      {"rng", DType::kUInt64, {2}, false},
      {"step", DType::kInt64, {}, false},
  };
}

Box BoxOf(const Spec& s, int p, int r) {
  Box b = FullBox(s.shape);
  if (s.sharded) {
    auto [lo, hi] = SplitRange(s.shape[0], p, r);
    b.start[0] = lo;
    b.count[0] = hi - lo;
  }
  return b;
}

TEST(Donation, BuffersOverwrittenAndFreedRightAfterSaveRestoreBitExact) {
  const int p = Size(), r = Rank();
  auto mgr = OpenForTest(FreshDir());
  ASSERT_TRUE(mgr);
  ASSERT_TRUE(mgr->async()) << "the regression needs the asynchronous path";
  const std::vector<Spec> model = Model(p);
  constexpr int kSteps = 4;

  for (int step = 0; step < kSteps; ++step) {
    // The "device buffers" of this step: heap allocations the loop owns.
    std::vector<std::unique_ptr<std::byte[]>> buffers;
    std::vector<ArrayToSave> arrays;
    std::vector<size_t> sizes;
    for (size_t i = 0; i < model.size(); ++i) {
      const Spec& s = model[i];
      Box box = BoxOf(s, p, r);
      std::vector<std::byte> values = Fill(s.dtype, s.shape, box, 1000 * step + i);
      buffers.emplace_back(new std::byte[values.size()]);
      std::memcpy(buffers.back().get(), values.data(), values.size());
      sizes.push_back(values.size());
      arrays.push_back({s.name, s.dtype, s.shape, {Shard{box, buffers.back().get()}}});
    }
    ASSERT_TRUE(mgr->Save(step, arrays).ok());
    // Donate: the next step reuses the memory, then it is freed.
    for (size_t i = 0; i < buffers.size(); ++i) std::memset(buffers[i].get(), 0xEE, sizes[i]);
    buffers.clear();
  }
  Status s = mgr->WaitUntilFinished();
  ASSERT_TRUE(s.ok()) << s.ToString();

  // Restore every step with another sharding (reversed rank order).
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<std::byte>> out;
    std::vector<ArrayToRestore> want;
    for (const Spec& spec : model) {
      Box box = BoxOf(spec, p, p - 1 - r);
      out.emplace_back(static_cast<size_t>(*Volume(box.count)) * DTypeSize(spec.dtype));
      want.push_back({spec.name, spec.dtype, {Destination{box, out.back().data()}}});
    }
    ASSERT_TRUE(mgr->Restore(step, want, RestoreOptions{.strict = true}).ok());
    for (size_t i = 0; i < model.size(); ++i) {
      EXPECT_TRUE(out[i] ==
                  Fill(model[i].dtype, model[i].shape, want[i].shards[0].box, 1000 * step + i))
          << model[i].name << " at step " << step << " on rank " << r;
    }
  }
}

}  // namespace
}  // namespace mhckpt
