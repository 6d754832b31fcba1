#!/usr/bin/env bash
# Creates the Python venv of the tests and examples (python/.venv, git-ignored)
# from python/requirements-test.txt (pinned: jax CPU, torch, mpi4py, pytest,
# scikit-build-core, nanobind), then installs mhckpt into it with
# `pip install .` — the same command a user runs.
#
#   python/setup_venv.sh            # idempotent: packages are installed once
#                                   # per requirements file; mhckpt is rebuilt
#                                   # incrementally (build-python/)
#   MHCKPT_VENV=/path python/setup_venv.sh
#
# Interpreter: Debian's /usr/bin/python3 (python3-venv and python3-dev come
# from scripts/bootstrap.sh). mpi4py is compiled against the system Open MPI.
# torch from PyPI is a CUDA build (~3 GB with its nvidia-* wheels), used on CPU
# here; it is downloaded once and the venv is reused while the pins stay.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${MHCKPT_VENV:-python/.venv}
PY=${PYTHON:-/usr/bin/python3}
REQ=python/requirements-test.txt
KEY="$($PY --version 2>&1) $(sha256sum "$REQ" | cut -c1-16)"
STAMP="$VENV/.requirements-stamp"

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$KEY" ]; then
  echo "setup_venv: installing $REQ into $VENV"
  [ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
  # The installed venv takes ~6 GiB, and pip holds the downloaded wheels
  # (~3.5 GiB) until it has installed them all: say so before running out.
  free_kib=$(df -Pk "$VENV" | awk 'NR == 2 { print $4 }')
  if [ "${free_kib:-0}" -lt $((10 * 1024 * 1024)) ]; then
    echo "setup_venv: warning: $((free_kib / 1024)) MiB free under $VENV;" \
         "installing the pinned packages needs about 10 GiB" >&2
  fi
  # No pip cache: the venv is kept while the pins stay, and a cached copy of
  # the wheels would take another ~3.5 GiB.
  "$VENV/bin/python" -m pip install -q --no-cache-dir --upgrade pip
  "$VENV/bin/python" -m pip install -q --no-cache-dir -r "$REQ"
  echo "$KEY" > "$STAMP"
fi

echo "setup_venv: pip install . into $VENV"
"$VENV/bin/python" -m pip install -q --no-cache-dir --no-build-isolation --no-deps .
"$VENV/bin/python" -c 'import mhckpt, sys; print("setup_venv: mhckpt", mhckpt.__version__, "in", sys.prefix)'
