#!/usr/bin/env bash
# The long form of the crash-state explorer (docs/TESTING.md "Crash
# states"): recorded saves of the shared root (np 2 independent, np 3
# collective with retention, np 4 with writes kept whole, np 4 with subfiles)
# and of the local tier (4 nodes with copies, recycling a step; 3 nodes with
# XOR parity, into a fresh directory and recycling a step), each explored
# under both models with cuts after every operation but the data writes and
# after 300 of those, and checked at another world size (the local tier: at
# one rank per node, every node's dir seen).
#   tests/crashstate/run_long.sh [BUILD_DIR] [WORK_DIR] [CASE...]
# Summaries go to WORK_DIR/<case>/summary.json; exit 1 if any case fails.
# CASE names limit the run to those cases.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
work=${2:-/tmp/mhckpt-crashstate-long}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpiexec="mpiexec --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none"
common=(--job "$build/bin/state_job" --shim "$build/lib/librecord_fs.so" --cli "$build/bin/mhckpt"
        "--mpiexec=$mpiexec" --model ext4,posix --write-cuts 300 --random-per-cut 8
        --max-states 1500 --cli-sample 10 --control-states 40 --strace-check --rows 2048)
shift 2 2>/dev/null || shift $#
only=("$@")
rc=0
run() {
  local name=$1
  shift
  if ((${#only[@]})) && [[ ! " ${only[*]} " == *" $name "* ]]; then return; fi
  echo "== $name: $*"
  /usr/bin/python3 "$here/explore.py" --work "$work/$name" "${common[@]}" "$@" || rc=1
}
run np2_independent --np 2 --check-np 2 --seed 11
run np3_collective_retention --np 3 --check-np 2 --collective --max-to-keep 1 --seed 12
run np4_independent_writes_whole --np 4 --check-np 1 --granularity write --seed 13
run np4_subfiles --np 4 --check-np 3 --files 2 --format 3 --seed 14
# The local tier (the shared root gets nothing): the checker needs a rank on
# every node. A recycled directory has only the marker's name to lose, so
# the `nodirfsync` control runs where the step directory is fresh.
run local_np4_copies_recycle --local --np 4 --nodes 4 --copies 1 --local-keep 2 --check-np 4 \
  --controls nofsync --seed 15
run local_np3_parity_fresh --local --np 3 --nodes 3 --parity 3 --local-keep 2 --before 1 \
  --check-np 3 --seed 16
run local_np3_parity_recycle --local --np 3 --nodes 3 --parity 3 --local-keep 2 --check-np 3 \
  --controls nofsync --seed 17
exit $rc
