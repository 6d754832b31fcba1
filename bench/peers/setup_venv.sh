#!/usr/bin/env bash
# Makes the venv of the peer benchmarks. It is the Python package's own venv
# (python/setup_venv.sh: jax + jaxlib CPU, torch, numpy, ml_dtypes, mpi4py,
# pinned in python/requirements-test.txt, and mhckpt itself by `pip install .`)
# plus the packages only the peers need, pinned: orbax-checkpoint, tensorstore,
# psutil. One venv for the tests, the examples and the benchmarks: torch and
# its CUDA wheels (~3 GB) are downloaded once.
#
#   bench/peers/setup_venv.sh          # idempotent; the peer packages are installed once per stamp
#   VENV=/path/to/venv bench/peers/setup_venv.sh
#
# The versions the peers were measured with are checked against the tests'
# pins (SHARED below): a mismatch stops here rather than silently moving a
# pin under the tests or the figures.
#
# Interpreter: Debian's /usr/bin/python3 (3.11 on Debian 12), with python3-venv
# and python3-dev from apt (scripts/bootstrap.sh; python3-venv is installed here
# if missing). Debian's python3-h5py-mpi and python3-mpi4py are for the h5py
# peer, which runs under /usr/bin/python3 directly, not in this venv.
#
# torch: PyPI's Linux wheels are CUDA builds, and the PyPI wheel cannot run
# without the CUDA wheels: libtorch.so links libtorch_cuda.so, which links
# cuDNN, cuBLAS, NCCL, cuSPARSELt, NVSHMEM, cuFile... (installing torch with
# --no-deps fails at import, "libcufile.so.0: cannot open shared object file",
# and a machine's own /usr/local/cuda does not satisfy it: an older NCCL there
# fails with "undefined symbol: ncclCommResume"). So torch comes with its
# dependencies, ~3 GB of nvidia-* wheels, and is used on CPU only (gloo). Set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu where that index is
# reachable (it was not from the machine this was written on) to install the
# ~200 MB CPU build first; it satisfies the tests' pin.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${VENV:-python/.venv}
PY=${PYTHON:-/usr/bin/python3}
REQ=python/requirements-test.txt

SHARED=(jax==0.10.2 jaxlib==0.10.2 ml_dtypes==0.6.0 numpy==2.4.6 torch==2.15.0)
PEER_ONLY=(orbax-checkpoint==0.12.8 tensorstore==0.1.86 psutil==7.2.2)
TORCH_INDEX=${TORCH_INDEX:-}

for pin in "${SHARED[@]}"; do
  if ! grep -qx "$pin" "$REQ"; then
    echo "setup_venv: $REQ does not pin $pin, the version the peers use; make the two agree" >&2
    exit 1
  fi
done

if ! $PY -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup_venv: installing python3-venv"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi

if [ -n "$TORCH_INDEX" ] && ! [ -f "$VENV/.requirements-stamp" ]; then
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  torch=$(printf '%s\n' "${SHARED[@]}" | grep '^torch==')
  "$VENV/bin/python" -m pip install -q --index-url "$TORCH_INDEX" "${torch}+cpu"
fi

# The tests' venv, with mhckpt installed from this tree (pip install .).
MHCKPT_VENV="$VENV" PYTHON="$PY" python/setup_venv.sh

KEY="$("$VENV/bin/python" --version 2>&1) ${PEER_ONLY[*]} ${SHARED[*]}"
STAMP="$VENV/.peers-stamp"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  echo "setup_venv: peer packages in $VENV up to date"
  exit 0
fi

echo "setup_venv: installing ${PEER_ONLY[*]} into $VENV"
# The shared pins on the same command line: pip may add packages, never move these.
"$VENV/bin/python" -m pip install -q "${PEER_ONLY[@]}" "${SHARED[@]}"

"$VENV/bin/python" - <<'PY'
import os
import numpy, psutil, jax, jaxlib, orbax.checkpoint, tensorstore, torch, torch.distributed as dist, mpi4py, mhckpt
assert dist.is_available() and dist.is_gloo_available(), "torch without gloo"
# A one-process gloo group: proves torch.distributed works without the CUDA wheels.
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(4); dist.all_reduce(t); dist.destroy_process_group()
from importlib.metadata import version
for p in ["jax", "jaxlib", "orbax-checkpoint", "tensorstore", "torch", "numpy", "ml_dtypes", "psutil", "mpi4py", "mhckpt"]:
    print(f"  {p} {version(p)}")
print("  jax devices:", jax.devices(), " torch cuda available:", torch.cuda.is_available())
PY
echo "$KEY" > "$STAMP"
echo "setup_venv: $VENV ready"
