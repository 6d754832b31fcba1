#!/usr/bin/env bash
# Installs what mhckpt needs from Debian, then configures and builds into build/.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#
#   scripts/bootstrap.sh         everything: the library, programs, tests, benchmarks
#   scripts/bootstrap.sh demo    what scripts/demo.sh needs: the library, the
#                                training demo and the CLI (first run in minutes);
#                                tests and benchmarks build when they are asked for
#
# Debian packages, and why (the first group is all the demo needs):
#   cmake g++ make pkg-config    the build
#   openmpi-bin libopenmpi-dev    MPI (Open MPI 4.1), mpirun
#   libhdf5-openmpi-dev hdf5-tools  parallel HDF5 1.10 and h5ls/h5dump
#   nlohmann-json3-dev            JSON (commit marker, plan encoding)
#   libfmt-dev                    formatting
#   libspdlog-dev                 logging
#   libxxhash-dev                 hashing (plan cache; checksums)
#   libcli11-dev                  command-line parsing (mhckpt CLI, mhckpt-train-demo)
# and for the tests:
#   libgtest-dev                  GoogleTest
#   python3-h5py-mpi python3-numpy  reading checkpoints without mhckpt (tests)
#   slurm-wlm                     Slurm (slurmctld, slurmd, srun): the local cluster of the slurm tests
#   munge                         Slurm's authentication daemon (slurm/local-cluster.sh starts it)
#   clang-14 libclang-rt-14-dev   libFuzzer for fuzz/run.sh (ctest label fuzz; skipped without)
#   python3-venv python3-dev      the Python package: its venv (python/setup_venv.sh) and headers
# With MHCKPT_BENCH=1 (bench/run.sh sets it), also the benchmark's (the disk's own speed is measured with dd):
#   python3-matplotlib            bench/report.py --plot (optional)
#   python3-mpi4py                the plain h5py collective write (bench/peers/h5py_bench.py)
#   python3-venv                  the virtualenv python/.venv for the PyPI peers (Orbax, PyTorch DCP)
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-all}
case "$MODE" in
  all | demo) ;;
  *) echo "bootstrap: unknown mode '$MODE' (all or demo)" >&2; exit 2 ;;
esac
PACKAGES=(cmake g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          nlohmann-json3-dev libfmt-dev libspdlog-dev libxxhash-dev libcli11-dev)
[ "$MODE" = all ] && PACKAGES+=(libgtest-dev python3-h5py-mpi python3-numpy clang-14 libclang-rt-14-dev
                                slurm-wlm munge python3-venv python3-dev)
[ "${MHCKPT_BENCH:-0}" = 1 ] && PACKAGES+=(python3-matplotlib python3-mpi4py)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# The tests are configured where GoogleTest is installed (always after a full
# bootstrap; a demo bootstrap leaves a configured tree's tests as they are).
tests=OFF
dpkg-query -W -f='${Status}' libgtest-dev 2>/dev/null | grep -q "install ok installed" && tests=ON
# A fresh build tree compiles the library as unity builds (a batch of
# sources per compiler run: the cold build in about 60% of the time; the
# tests then run against that library). One the demo configures first is
# also optimized without debug info (-O2, as the default RelWithDebInfo, in
# half its compile time). A tree keeps both when a full bootstrap builds the
# tests in it later; -DMHCKPT_UNITY_BUILD=OFF in CMAKE_ARGS turns unity off.
first=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  first=(-DMHCKPT_UNITY_BUILD=ON)
  if [ "$MODE" = demo ]; then
    first+=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG")
  fi
fi
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" "${first[@]}" -DMHCKPT_BUILD_TESTS=$tests ${CMAKE_ARGS:-} >/dev/null
if [ "$MODE" = demo ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target mhckpt_train_demo mhckpt_cli
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
