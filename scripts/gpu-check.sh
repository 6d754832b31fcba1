#!/usr/bin/env bash
# The one prepared GPU check, sized for a short loan of a GPU machine (well
# under 8 minutes from a clean checkout where CUDA and the Debian packages
# are installed):
#   1. prints nvidia-smi, the driver and toolkit versions and the commit;
#   2. installs Debian packages only if some are missing (scripts/bootstrap.sh
#      lists them), and builds only what the GPU tests need (gpu_test,
#      donation_test, save_restore_test, mhckpt-gpu-stall) into build-gpu/
#      (host code only, linked with cudart: no GPU architecture to choose);
#   3. runs every gpu-labelled test (ordering of save and restore with the
#      caller's stream, each with its negative control; lazy saves of device
#      buffers: Save returns before the copy, which sees the work queued on
#      the caller's stream before Save, with a negative control; donation
#      right after Save; a replicated array read once into every GPU; no
#      context on a device not asked for; 2 -> 3 ranks resharding) and fails if any was
#      skipped although a GPU is present; then donation and save_restore;
#   4. prints the stall figure: Save's stall for 1 GiB of device memory
#      against a plain cudaMemcpy D2H of the same bytes (one JSON line per
#      world size).
# Exits non-zero on any failure; prints "skipped: no GPU" and exits 0 without one.
# On a bare, offline GPU machine (no Debian packages, no network) use the
# bundle of scripts/gpu-bundle.sh instead (docs/TESTING.md, "The GPU check offline").
# MHCKPT_GPU_CHECK_PYTHON=1 also runs the torch CUDA tests (needs python/.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no GPU"
  exit 0
fi

# 1. The machine.
echo "== gpu-check at commit $(git log -1 --format='%h (%cs)' 2>/dev/null || echo unknown)"
nvidia-smi
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] && "$NVCC" --version | tail -n 2
ls /usr/local/cuda*/lib64/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -n 3 || true

# 2. Packages (only if missing) and the GPU targets.
missing=0
for p in cmake g++ openmpi-bin libopenmpi-dev libhdf5-openmpi-dev nlohmann-json3-dev libfmt-dev \
  libspdlog-dev libxxhash-dev libgtest-dev libcli11-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing=1
done
if [ "$missing" = 1 ]; then
  echo "== some Debian packages are missing: scripts/bootstrap.sh installs them (and builds all)"
  BUILD_DIR=build-gpu CMAKE_ARGS="${CMAKE_ARGS:-}" scripts/bootstrap.sh >/dev/null
fi
cmake -S . -B build-gpu -DMHCKPT_WITH_CUDA=ON -DMHCKPT_BUILD_BENCH=ON ${CMAKE_ARGS:-} >/dev/null
grep -E '^NCCL_LIBRARY:' build-gpu/CMakeCache.txt || echo 'gpu-check: NCCL not found (the MPI fallback only)'
cmake --build build-gpu -j "$(nproc)" --target gpu_test donation_test save_restore_test \
  mhckpt_gpu_stall
echo "== built in $((SECONDS - start)) s"

# 3. The tests.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 120 2>&1) || {
  echo "$out"
  exit 1
}
echo "$out"
# gpu.contexts skips with one GPU (it needs a second device to watch).
if grep "Skipped" <<<"$out" | grep -qv "gpu.contexts"; then
  echo "gpu-check: GPU tests were skipped although a GPU is present" >&2
  exit 1
fi
ctest --test-dir build-gpu -R '^(donation|save_restore)\.np2$' --output-on-failure --timeout 120
if [ "${MHCKPT_GPU_CHECK_PYTHON:-0}" = 1 ]; then
  python/run_pytest.sh 1 python/tests/test_torch_cuda.py
fi

# 4. The stall figure.
ngpu=$(nvidia-smi -L | wc -l)
for np in 1 2; do
  echo "== stall, $np rank(s) on $ngpu GPU(s), 1 GiB each"
  mpirun -np "$np" --oversubscribe build-gpu/bin/mhckpt-gpu-stall 1024 /tmp/mhckpt-gpu-stall
done
echo "== gpu-check done in $((SECONDS - start)) s"
