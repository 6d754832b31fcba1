#!/bin/bash
# Restore with and without RestoreOptions::read_once of a checkpoint whose
# boxes several ranks want (mhckpt-read-once-bench, bench/read_once_bench.cc):
# ~MIB MiB saved as tensor parallelism 2 x data parallelism np/2, restored
#   tp2  as saved: each half of each array wanted by np/2 ranks
#   dp   every rank wanting every array in its two halves (the same box set)
# REPS restores each way, interleaved, the page cache dropped before each
# where /proc/sys/vm/drop_caches can be written. Prints a Markdown table:
# median (min / max) of the slowest rank's Restore() seconds, and the bytes
# read from storage summed over the ranks (io::BytesRead), against the bytes
# the ranks asked for.
#
#   bench/run_read_once.sh [MIB=1024] [REPS=3]
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp], NPS ["2 4"],
# DROP_CACHES [1] (0: warm restores).
set -euo pipefail
MIB=${1:-1024}
REPS=${2:-3}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
NPS=${NPS:-"2 4"}
BIN=$BUILD_DIR/bin/mhckpt-read-once-bench
[ -x "$BIN" ] || { echo "bench/run_read_once.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)
DROP=()
if [ "${DROP_CACHES:-1}" = 1 ] && sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
  DROP=(--drop-caches)
else
  echo "bench/run_read_once.sh: the page cache is NOT dropped" >&2
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $MIB MiB, $REPS reps, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in $NPS; do
  "${MPI[@]}" -np "$np" "$BIN" --mib "$MIB" --reps "$REPS" --dir "$CKPT_DIR" "${DROP[@]}" |
    grep '^RESULT' >>"$out"
done
python3 - "$out" <<'PY'
import sys
rows = [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in open(sys.argv[1])]
gib = lambda b: int(b) / 2**30
print("| np | layout | read_once | restore s, median (min / max) | read from storage GiB | asked for GiB | page cache | load after |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    print("| %s | %s | %s | %s (%s / %s) | %.2f | %.2f | %s | %s |" % (
        r["np"], r["layout"], "on" if r["read_once"] == "1" else "off", r["median_s"],
        r["min_s"], r["max_s"], gib(r["bytes_read"]), gib(r["wanted_bytes"]), r["cache"],
        r["loadavg"].replace(",", " ")))
PY
