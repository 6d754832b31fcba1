#include "io/box_runs.h"

namespace mhckpt::io {

// The box is contiguous from the first dimension k at which every later
// dimension is whole; each index of dimensions 0..k-1 starts one run.
std::vector<BoxRun> BoxRuns(const Placement& p, const Box& box) {
  std::vector<BoxRun> runs;
  if (!p.offset || Volume(box.count).value_or(0) == 0) return runs;
  const size_t nd = p.shape.size();
  if (nd == 0) return {{*p.offset, 0, p.element}};
  std::vector<uint64_t> stride(nd, 1);  // in elements
  for (size_t d = nd - 1; d-- > 0;)
    stride[d] = stride[d + 1] * static_cast<uint64_t>(p.shape[d + 1]);
  size_t k = nd - 1;
  while (k > 0 && box.count[k] == p.shape[k]) --k;
  const size_t run_bytes = static_cast<size_t>(box.count[k]) * stride[k] * p.element;
  std::vector<int64_t> index(k, 0);
  size_t at = 0;
  for (;;) {
    uint64_t e = static_cast<uint64_t>(box.start[k]) * stride[k];
    for (size_t d = 0; d < k; ++d) e += static_cast<uint64_t>(box.start[d] + index[d]) * stride[d];
    const uint64_t offset = *p.offset + e * p.element;
    if (!runs.empty() && runs.back().offset + runs.back().size == offset) {
      runs.back().size += run_bytes;  // adjacent in the file and in memory
    } else {
      runs.push_back({offset, at, run_bytes});
    }
    at += run_bytes;
    size_t d = k;
    while (d > 0 && ++index[d - 1] == box.count[d - 1]) index[--d] = 0;
    if (d == 0) return runs;
  }
}

}  // namespace mhckpt::io
