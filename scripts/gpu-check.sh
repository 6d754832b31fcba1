#!/usr/bin/env bash
# On a machine with a GPU: builds with CUDA (sm_90 for H100/H200 unless
# CUDAARCHS says otherwise) and runs the gpu-labelled tests. Fails if they
# skip, since here a device must be present. Takes a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDAARCHS=${CUDAARCHS:-90}
BUILD_DIR=build-gpu CMAKE_ARGS="-DMHCKPT_WITH_CUDA=ON" scripts/bootstrap.sh
nvidia-smi -L || true
out=$(ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 240 2>&1) || { echo "$out"; exit 1; }
echo "$out"
if grep -q "Skipped" <<<"$out"; then
  echo "gpu-check: GPU tests were skipped: no usable CUDA device" >&2
  exit 1
fi
# The regression and round trips again, with the CUDA-enabled build.
ctest --test-dir build-gpu -R '^(donation|save_restore)\.np2$' --output-on-failure --timeout 240
