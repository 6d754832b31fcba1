#!/usr/bin/env bash
# Installs what mhckpt needs from Debian, then configures and builds into build/.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#
# Debian packages, and why:
#   cmake g++ make pkg-config    the build
#   openmpi-bin libopenmpi-dev    MPI (Open MPI 4.1), mpirun
#   libhdf5-openmpi-dev hdf5-tools  parallel HDF5 1.10 and h5ls/h5dump
#   nlohmann-json3-dev            JSON (commit marker, plan encoding)
#   libfmt-dev                    formatting
#   libspdlog-dev                 logging
#   libxxhash-dev                 hashing (plan cache; checksums)
#   libgtest-dev                  GoogleTest
#   python3-h5py-mpi python3-numpy  reading checkpoints without mhckpt (tests)
#   libcli11-dev                  command-line parsing (mhckpt CLI, mhckpt-train-demo)
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

PACKAGES=(cmake g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          nlohmann-json3-dev libfmt-dev libspdlog-dev libxxhash-dev libgtest-dev python3-h5py-mpi python3-numpy
          libcli11-dev clang-14 libclang-rt-14-dev slurm-wlm munge python3-venv python3-dev)
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
cmake -S . -B "$BUILD_DIR" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
