#!/usr/bin/env bash
# Creates bench/.venv (git-ignored) with the peer checkpoint systems, pinned:
# jax + jaxlib (CPU), orbax-checkpoint, torch (CPU), numpy, psutil.
#
#   bench/peers/setup_venv.sh          # idempotent; a no-op when the stamp matches
#   VENV=/path/to/venv bench/peers/setup_venv.sh
#
# Interpreter: Debian's /usr/bin/python3 (3.11 on Debian 12), with python3-venv
# from apt (installed here if missing). Debian's python3-h5py-mpi and
# python3-mpi4py (scripts/bootstrap.sh) are for the h5py peer, which runs under
# /usr/bin/python3 directly, not in this venv.
#
# torch: PyPI's Linux wheels are CUDA builds. download.pytorch.org's CPU-only
# index was not reachable from the machine this was written on, and the PyPI
# wheel cannot run without the CUDA wheels: libtorch.so links libtorch_cuda.so,
# which links cuDNN, cuBLAS, NCCL, cuSPARSELt, NVSHMEM, cuFile... (installing
# torch with --no-deps fails at import, "libcufile.so.0: cannot open shared
# object file", and a machine's own /usr/local/cuda does not satisfy it: an
# older NCCL there fails with "undefined symbol: ncclCommResume"). So torch is
# installed with its dependencies, ~3 GB of nvidia-* wheels, and used on CPU
# only (gloo). Set TORCH_INDEX=https://download.pytorch.org/whl/cpu where that
# index is reachable to get the ~200 MB CPU build instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=${VENV:-bench/.venv}
PY=${PYTHON:-/usr/bin/python3}

PINS=(jax==0.10.2 jaxlib==0.10.2 orbax-checkpoint==0.12.8 tensorstore==0.1.86 ml_dtypes==0.6.0
      numpy==2.4.6 psutil==7.2.2)
TORCH=torch==2.15.0
TORCH_INDEX=${TORCH_INDEX:-}
KEY="$($PY --version 2>&1) ${PINS[*]} $TORCH $TORCH_INDEX"
STAMP="$VENV/.peers-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ]; then
  echo "setup_venv: $VENV up to date"
  exit 0
fi

if ! $PY -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup_venv: installing python3-venv"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi

[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${PINS[@]}"
if [ -n "$TORCH_INDEX" ]; then
  "$VENV/bin/python" -m pip install -q --index-url "$TORCH_INDEX" "${TORCH}+cpu"
else
  "$VENV/bin/python" -m pip install -q "$TORCH"
fi

"$VENV/bin/python" - <<'PY'
import os, tempfile
import numpy, psutil, jax, jaxlib, orbax.checkpoint, tensorstore, torch, torch.distributed as dist
assert dist.is_available() and dist.is_gloo_available(), "torch without gloo"
# A one-process gloo group: proves torch.distributed works without the CUDA wheels.
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(4); dist.all_reduce(t); dist.destroy_process_group()
from importlib.metadata import version
for p in ["jax", "jaxlib", "orbax-checkpoint", "tensorstore", "torch", "numpy", "psutil"]:
    print(f"  {p} {version(p)}")
print("  jax devices:", jax.devices(), " torch cuda available:", torch.cuda.is_available())
PY
echo "$KEY" > "$STAMP"
echo "setup_venv: $VENV ready"
