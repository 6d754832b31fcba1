#!/usr/bin/env bash
# Runs the Python package's pytest suite (python/tests) as an MPI job of NP
# ranks, with the venv of python/setup_venv.sh. ctest calls it (label python,
# tests/CMakeLists.txt); by hand:
#
#   python/run_pytest.sh 3                          # the suite at 3 ranks
#   python/run_pytest.sh 2 python/tests/test_jax.py -k sharding -v
#
# Test paths are relative to the repository root (the script runs there).
#
# Exits 77 (ctest: skipped, not passed) when the venv, the installed package
# or a test dependency is missing: run python/setup_venv.sh first. A package
# that is installed but does not import is a failure. Every rank runs the same
# tests; rank 0 prints pytest's report, the other ranks one line per failure.
#
# Environment: MHCKPT_VENV (default python/.venv), MPIEXEC (default mpiexec),
# MHCKPT_MPIEXEC_FLAGS (default: the flags of tests/CMakeLists.txt).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 NP [pytest arguments...]" >&2
  exit 2
fi
np=$1
shift

venv=${MHCKPT_VENV:-$repo/python/.venv}
py=$venv/bin/python
if [ ! -x "$py" ] || [ ! -f "$venv/bin/pytest" ]; then
  echo "run_pytest: SKIPPED: no venv with pytest at $venv (run python/setup_venv.sh)"
  exit 77
fi
# From / so that `import mhckpt` finds the installed package, not the sources.
check='
import importlib.util, sys
missing = [m for m in ("mhckpt", "pytest", "mpi4py", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    print(f"run_pytest: SKIPPED: {sys.prefix} lacks {missing} (run python/setup_venv.sh)")
    sys.exit(77)
import mhckpt._core  # installed but broken: an ImportError, a failure
'
(cd / && "$py" -c "$check") || exit $?

read -r -a flags <<< "${MHCKPT_MPIEXEC_FLAGS:---oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none}"
# The venv's pytest script, not `python -m pytest`: that would put the working
# directory on sys.path, and from python/ the sources (without the built
# extension) would shadow the installed package. No cache: every rank would
# write the same files.
# From the repository root (the rootdir), where testpaths applies: without a
# test path among the arguments, the suite is python/tests.
cd "$repo"
exec "${MPIEXEC:-mpiexec}" -n "$np" "${flags[@]}" \
  "$py" "$venv/bin/pytest" -p no:cacheprovider --color=no -o testpaths=python/tests \
  -o faulthandler_timeout=240 "$@"
