#!/bin/bash
# Cold restores with and without the read-ahead thread (RestoreOptions::prefault)
# beside a cold sequential read of the same data file with dd, interleaved:
# for each world size in NPS, mhckpt-bench saves ~MIB MiB once (--keep), then
# REPS rounds of [restore --prefault on, restore --prefault off, dd], the page
# cache dropped before each (each restore into new, untouched memory, after one
# untimed warm-up restore). Prints a Markdown table of medians (min / max) of
# the slowest rank's Restore() seconds and of dd's, and their ratios.
#
#   bench/run_prefault.sh [MIB=1024] [REPS=5]
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp], NPS ["1 2 4"].
# Needs root (drop_caches); refuses to run without it.
set -euo pipefail
MIB=${1:-1024}
REPS=${2:-5}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
NPS=${NPS:-"1 2 4"}
BIN=$BUILD_DIR/bin/mhckpt-bench
[ -x "$BIN" ] || { echo "bench/run_prefault.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches ||
  { echo "bench/run_prefault.sh: cannot drop the page cache (not root?)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1)

work=$(mktemp -d)
trap 'rm -rf "$work" "$CKPT_DIR"/mhckpt-prefault-*' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $MIB MiB, $REPS reps," \
  "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in $NPS; do
  dir=$CKPT_DIR/mhckpt-prefault-$np
  rm -rf "$dir" && mkdir -p "$dir"
  "${MPI[@]}" -np "$np" "$BIN" --mode save --mib "$MIB" --reps 1 --dir "$dir" --keep >/dev/null
  ckpt=$dir/mhckpt-bench-sharded
  data=$(ls "$ckpt"/step_*/data.h5 | tail -1)
  for rep in $(seq "$REPS"); do
    for p in on off; do
      "${MPI[@]}" -np "$np" "$BIN" --mode restore --dir "$ckpt" --reps 1 --drop-caches \
        --prefault "$p" --json "$work/$np-$p-$rep.json" >/dev/null
    done
    sync && echo 3 >/proc/sys/vm/drop_caches
    s=$(date +%s%N)
    dd if="$data" of=/dev/null bs=4M status=none
    echo "$s $(date +%s%N)" >"$work/$np-dd-$rep.txt"
  done
  rm -rf "$dir"
done
python3 - "$work" "$NPS" <<'PY'
import glob, json, os, statistics, sys
work, nps = sys.argv[1], sys.argv[2].split()
def figures(np, what):
    out = []
    for f in sorted(glob.glob(os.path.join(work, f"{np}-{what}-*"))):
        if what == "dd":
            start, end = map(int, open(f).read().split())
            out.append((end - start) / 1e9)
        else:
            out += [r["restore_s"] for r in json.load(open(f))]
    return out
cell = lambda v: "%.2f (%.2f / %.2f)" % (statistics.median(v), min(v), max(v))
print("| np | prefault on, s | prefault off, s | cold dd read, s | on vs off | dd / on |")
print("| --- | --- | --- | --- | --- | --- |")
for np in nps:
    on, off, dd = figures(np, "on"), figures(np, "off"), figures(np, "dd")
    m = statistics.median
    print(f"| {np} | {cell(on)} | {cell(off)} | {cell(dd)} | {m(off) / m(on):.2f}x | {m(dd) / m(on):.2f}x |")
PY
