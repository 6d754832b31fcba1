#!/bin/bash
# Cold restores with a restore option on and off — the read-ahead thread
# (OPTION=prefault, RestoreOptions::prefault, the default) or direct reads
# (OPTION=direct-reads, RestoreOptions::direct_reads) — beside a cold
# sequential read of the same data file with dd and, with H5PY=1, h5py's naive
# read of it (bench/peers/h5py_read.py), interleaved: for each world size in
# NPS, mhckpt-bench saves ~MIB MiB once (--keep), then REPS rounds of
# [restore --OPTION on, restore --OPTION off, dd, h5py], the page cache dropped
# before each (each restore into new, untouched memory, after one untimed
# warm-up restore). Prints a Markdown table of medians (min / max) of the
# slowest rank's Restore() seconds and of the others', and their ratios.
#
#   bench/run_prefault.sh [MIB=1024] [REPS=5]
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp], NPS ["1 2 4"],
# OPTION [prefault], H5PY [0]. Needs root (drop_caches); refuses to run
# without it.
set -euo pipefail
MIB=${1:-1024}
REPS=${2:-5}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
NPS=${NPS:-"1 2 4"}
OPTION=${OPTION:-prefault}
H5PY=${H5PY:-0}
case $OPTION in prefault | direct-reads) ;; *) echo "bench/run_prefault.sh: OPTION is prefault or direct-reads" >&2; exit 1 ;; esac
BIN=$BUILD_DIR/bin/mhckpt-bench
[ -x "$BIN" ] || { echo "bench/run_prefault.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches ||
  { echo "bench/run_prefault.sh: cannot drop the page cache (not root?)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

work=$(mktemp -d)
trap 'rm -rf "$work" "$CKPT_DIR"/mhckpt-prefault-*' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $MIB MiB, $REPS reps," \
  "--$OPTION on/off, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for np in $NPS; do
  dir=$CKPT_DIR/mhckpt-prefault-$np
  rm -rf "$dir" && mkdir -p "$dir"
  "${MPI[@]}" -np "$np" "$BIN" --mode save --mib "$MIB" --reps 1 --dir "$dir" --keep >/dev/null
  ckpt=$dir/mhckpt-bench-sharded
  data=$(ls "$ckpt"/step_*/data.h5 | tail -1)
  for rep in $(seq "$REPS"); do
    for p in on off; do
      "${MPI[@]}" -np "$np" "$BIN" --mode restore --dir "$ckpt" --reps 1 --drop-caches \
        "--$OPTION" "$p" --json "$work/$np-$p-$rep.json" >/dev/null
    done
    sync && echo 3 >/proc/sys/vm/drop_caches
    s=$(date +%s%N)
    dd if="$data" of=/dev/null bs=16M status=none
    echo "$s $(date +%s%N)" >"$work/$np-dd-$rep.txt"
    if [ "$H5PY" = 1 ]; then
      sync && echo 3 >/proc/sys/vm/drop_caches
      "${MPI[@]}" -np "$np" /usr/bin/python3 bench/peers/h5py_read.py "$data" \
        >"$work/$np-h5py-$rep.json"
    fi
  done
  rm -rf "$dir"
done
python3 - "$work" "$NPS" "$OPTION" <<'PY'
import glob, json, os, statistics, sys
work, nps, option = sys.argv[1], sys.argv[2].split(), sys.argv[3]
def figures(np, what):
    out = []
    for f in sorted(glob.glob(os.path.join(work, f"{np}-{what}-*"))):
        if what == "dd":
            start, end = map(int, open(f).read().split())
            out.append((end - start) / 1e9)
        elif what == "h5py":
            out.append(json.load(open(f))["restore_s"])
        else:
            out += [r["restore_s"] for r in json.load(open(f))]
    return out
cell = lambda v: "%.2f (%.2f / %.2f)" % (statistics.median(v), min(v), max(v)) if v else "-"
m = statistics.median
h5 = any(figures(np, "h5py") for np in nps)
head = f"| np | {option} on, s | {option} off, s | cold dd read, s |" + (" h5py read, s |" if h5 else "")
print(head + " on vs off | dd / on |" + (" h5py / on |" if h5 else ""))
print("|" + " --- |" * (head.count("|") - 1 + 2 + h5))
for np in nps:
    on, off, dd, hp = figures(np, "on"), figures(np, "off"), figures(np, "dd"), figures(np, "h5py")
    row = f"| {np} | {cell(on)} | {cell(off)} | {cell(dd)} |" + (f" {cell(hp)} |" if h5 else "")
    row += f" {m(off) / m(on):.2f}x | {m(dd) / m(on):.2f}x |"
    if h5:
        row += f" {m(hp) / m(on):.2f}x |" if hp else " - |"
    print(row)
PY
