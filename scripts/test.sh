#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# default suite. GPU tests report "skipped" without a device.
#   1. scripts/bootstrap.sh (apt packages, configure, build into build/)
#   2. the donation regression test under AddressSanitizer (build-address/)
#      and ThreadSanitizer (build-thread/)
#   3. ctest over build/ (unit, mpi at 1-4 ranks, reshard matrix, crash, fuzz, ...;
#      not slurm unless MHCKPT_SLURM_TESTS=1)
# Extra arguments go to the last ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

if [ "${MHCKPT_SKIP_SANITIZERS:-0}" != 1 ]; then
  for san in address thread; do
    echo "== donation test under -fsanitize=$san (build-$san/)"
    cmake -S . -B "build-$san" -DMHCKPT_SANITIZE=$san -DMHCKPT_WITH_CUDA=OFF >/dev/null
    cmake --build "build-$san" -j "$(nproc)" --target donation_test >/dev/null
    ctest --test-dir "build-$san" -R '^donation\.' --output-on-failure --timeout 300
  done
fi

echo "== test suite (build/)"
cd "${BUILD_DIR:-build}"
# The slurm label (a local Slurm cluster, slurm/) is left out by default until
# its intermittent first-job failure is understood (docs/SLURM.md); set
# MHCKPT_SLURM_TESTS=1 to run it too.
exclude=(-LE slurm)
[ "${MHCKPT_SLURM_TESTS:-0}" = 1 ] && exclude=()
ctest --output-on-failure --timeout 300 "${exclude[@]}" "$@"
