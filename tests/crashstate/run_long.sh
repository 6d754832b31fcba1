#!/usr/bin/env bash
# The long form of the crash-state explorer (docs/RELIABILITY.md "Crash
# states"): three recorded saves (np 2 independent, np 3 collective with
# retention, np 4 with writes kept whole), each explored under both models
# with cuts after every operation but the data writes and after 300 of those,
# and checked at another world size.
#   tests/crashstate/run_long.sh [BUILD_DIR] [WORK_DIR]
# Summaries go to WORK_DIR/<case>/summary.json; exit 1 if any case fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
work=${2:-/tmp/mhckpt-crashstate-long}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpiexec="mpiexec --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none"
common=(--job "$build/bin/state_job" --shim "$build/lib/librecord_fs.so" --cli "$build/bin/mhckpt"
        "--mpiexec=$mpiexec" --model ext4,posix --write-cuts 300 --random-per-cut 8
        --max-states 1500 --cli-sample 10 --control-states 40 --strace-check --rows 2048)
rc=0
run() {
  local name=$1
  shift
  echo "== $name: $*"
  /usr/bin/python3 "$here/explore.py" --work "$work/$name" "${common[@]}" "$@" || rc=1
}
run np2_independent --np 2 --check-np 2 --seed 11
run np3_collective_retention --np 3 --check-np 2 --collective --max-to-keep 1 --seed 12
run np4_independent_writes_whole --np 4 --check-np 1 --granularity write --seed 13
exit $rc
