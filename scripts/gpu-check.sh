#!/usr/bin/env bash
# The one prepared GPU check (docs/RELIABILITY.md, docs/PERFORMANCE.md). On a
# machine with a GPU, in a few minutes: builds with CUDA and NCCL (sm_90 for
# H100/H200 unless CUDAARCHS says otherwise) into build-gpu/, runs every
# gpu-labelled test — donation with cudaFree right after Save, Save while the
# caller's stream still writes the buffer, a replicated array read once into
# every GPU (NCCL at one rank per GPU, the MPI fallback where ranks share one),
# device buffers saved at 2 ranks and restored at 3 — then the donation and
# save/restore tests with the CUDA build, and prints Save's stall for 1 GiB of
# device memory against cudaMemcpy D2H of the same bytes.
# Exits non-zero on any failure; prints "skipped: no GPU" and exits 0 without one.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no GPU"
  exit 0
fi
nvidia-smi -L
git log -1 --format='gpu-check at commit %h (%cs)'
export CUDAARCHS=${CUDAARCHS:-90}
BUILD_DIR=build-gpu CMAKE_ARGS="-DMHCKPT_WITH_CUDA=ON" scripts/bootstrap.sh
grep -E '^NCCL_LIBRARY:' build-gpu/CMakeCache.txt || echo 'gpu-check: NCCL not found (the MPI fallback only)'
out=$(ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 240 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
if grep -q "Skipped" <<<"$out"; then
  echo "gpu-check: GPU tests were skipped although a GPU is present" >&2
  exit 1
fi
ctest --test-dir build-gpu -R '^(donation|save_restore|read_once)\.np2$' --output-on-failure \
  --timeout 240
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for np in 1 2; do
  echo "== stall, $np rank(s) on the GPU(s), 1 GiB each"
  mpirun -np "$np" --oversubscribe build-gpu/bin/mhckpt-gpu-stall 1024 /tmp/mhckpt-gpu-stall
done
