#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# default suite. GPU tests report "skipped" without a device.
#   1. scripts/bootstrap.sh (apt packages, configure, build into build/)
#   2. the donation regression test under AddressSanitizer (build-address/)
#      and ThreadSanitizer (build-thread/); the bad-input suite under ASan,
#      two managers saving at once in one process (the HDF5 lock) and the
#      local tier (its drain thread beside the I/O thread) under TSan
#   3. python/setup_venv.sh: the Python venv (python/.venv; the first run
#      downloads jax and torch) and `pip install .` of the mhckpt package, for
#      the python.* tests; MHCKPT_PYTHON_TESTS=0 skips it and leaves those tests out
#   4. ctest over build/ (unit, mpi at 1-4 ranks, reshard matrix, crash, crashstate, fuzz,
#      python: pytest at 1-4 ranks and N -> M restores,
#      slurm: a local Slurm cluster with a node failure; MHCKPT_SLURM_TESTS=0 skips it;
#      scale: 8-16 ranks and the 8,000-rank plan simulation, only with MHCKPT_SCALE_TESTS=1;
#      long: the full-length forms of tests the default suite runs shorter (the
#      crash phase matrix at every size, 20 random kills, the bad-input suite's
#      largest forged markers at 3-4 ranks, pytest at 4 ranks beyond
#      test_reshard.py, the torch example's second resume in python.np1),
#      only with MHCKPT_LONG_TESTS=1;
#      gpu_bundle: the offline GPU bundle of build/'s binaries in a mount
#      namespace, a few minutes; gpu_bundle_release: the Release bundle a GPU
#      machine gets, built from scratch, ~10 min cold, only with
#      MHCKPT_GPU_BUNDLE_TESTS=1)
# Extra arguments go to the last ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

if [ "${MHCKPT_SKIP_SANITIZERS:-0}" != 1 ]; then
  for san in address thread; do
    # Under ASan also the bad-input suite: bad inputs must not read out of bounds.
    targets=(donation_test lazy_save_test) tests='^(donation|lazy_save)\.'
    [ "$san" = address ] && targets+=(bad_input_test) tests='^(donation|lazy_save|bad_input)\.'
    # Under TSan also two managers of one process saving at once (the HDF5 lock)
    # and the local tier (a drain thread writes the shared root beside the I/O thread).
    [ "$san" = thread ] && targets+=(two_managers_test local_tier_test) tests='^(donation|lazy_save|two_managers|local_tier)\.'
    echo "== ${targets[*]} under -fsanitize=$san (build-$san/)"
    cmake -S . -B "build-$san" -DMHCKPT_SANITIZE=$san -DMHCKPT_WITH_CUDA=OFF >/dev/null
    cmake --build "build-$san" -j "$(nproc)" --target "${targets[@]}" >/dev/null
    long=(-LE '^long$')
    [ "${MHCKPT_LONG_TESTS:-0}" = 1 ] && long=()
    ctest --test-dir "build-$san" -R "$tests" "${long[@]}" --output-on-failure --timeout 300
  done
fi

exclude=()
if [ "${MHCKPT_PYTHON_TESTS:-1}" = 0 ]; then
  exclude+=(-E '^python\.')
else
  echo "== Python package (python/setup_venv.sh)"
  python/setup_venv.sh
fi

echo "== test suite (build/)"
cd "${BUILD_DIR:-build}"
# The slurm label brings up a local Slurm cluster (slurm/local-cluster.sh);
# MHCKPT_SLURM_TESTS=0 leaves it out. The scale label (jobs of 8-16 ranks and
# the 8,000-rank simulation, a few minutes; docs/SCALE.md) runs only with
# MHCKPT_SCALE_TESTS=1; its quick part (label scale_quick) always runs. The
# long label (the full forms of tests cut short by default) runs only with
# MHCKPT_LONG_TESTS=1, the gpu_bundle_release label only with
# MHCKPT_GPU_BUNDLE_TESTS=1.
left_out=()
[ "${MHCKPT_SLURM_TESTS:-1}" = 0 ] && left_out+=(slurm)
[ "${MHCKPT_SCALE_TESTS:-0}" = 1 ] || left_out+=(scale)
[ "${MHCKPT_LONG_TESTS:-0}" = 1 ] || left_out+=(long)
[ "${MHCKPT_GPU_BUNDLE_TESTS:-0}" = 1 ] || left_out+=(gpu_bundle_release)
if [ ${#left_out[@]} -gt 0 ]; then
  exclude+=(-LE "^($(IFS='|'; echo "${left_out[*]}"))\$")
fi
# -j: tests run side by side on the machine's cores; a test of N ranks counts
# as N (ctest PROCESSORS), and one that needs more ranks than cores runs alone.
ctest --output-on-failure --timeout 300 -j "$(nproc)" "${exclude[@]}" "$@"
