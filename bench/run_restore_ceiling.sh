#!/bin/bash
# Restores against the disk's ceiling measured in the same minute
# (mhckpt-bench --mode save/restore, bench/ckpt_bench.cc): for each size in
# SIZES (MiB, all ranks together) and world size N in NPS, a checkpoint saved
# at N, then REPS rounds, each of, back to back with the page cache dropped
# before every one:
#   restore      mhckpt-bench --mode restore at N (slowest rank; every byte checked)
#   ceiling      4 x N readers of the same data file with dd iflag=direct bs=16M,
#                each a disjoint range (as many reads in flight as the restore
#                has: kDirectReadThreads = 4 per rank), wall time
#   cold dd      one dd bs=16M of the file to /dev/null
#   N -> M       the same checkpoint restored at M (the next size of NPS, the
#                last one goes to the first), against the one saved at M
#                restored at M, in the same round
# Targets: restore <= 1.15x the ceiling, >= 1.0x a cold dd; N -> M <= 1.1x.
# Prints a Markdown table of medians.
#
#   bench/run_restore_ceiling.sh                 # SIZES="1024 4096" NPS="1 2 4" REPS=3
#   SIZES=256 NPS="1 2" REPS=2 bench/run_restore_ceiling.sh
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp] (a disk, not tmpfs;
# the checkpoints are removed after, unless KEEP_WORK=1), OUT (also write the
# JSON records here).
# Needs root to drop the page cache.
set -euo pipefail
SIZES=${SIZES:-1024 4096}
NPS=${NPS:-1 2 4}
REPS=${REPS:-3}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
BIN=$BUILD_DIR/bin/mhckpt-bench
[ -x "$BIN" ] || { echo "bench/run_restore_ceiling.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
sync && echo 3 >/proc/sys/vm/drop_caches || { echo "bench/run_restore_ceiling.sh: cannot drop the page cache (needs root)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
     --mca btl_vader_single_copy_mechanism none)
work=$(mktemp -d "$CKPT_DIR/mhckpt-ceiling.XXXXXX")
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
nps=($NPS)
next_np() {  # the world size after $1 in NPS, the first after the last
  local i
  for i in "${!nps[@]}"; do
    if [ "${nps[$i]}" = "$1" ]; then echo "${nps[$(( (i + 1) % ${#nps[@]} ))]}"; return; fi
  done
}
restore_s() {  # ROOT NP: the restore's median seconds (one rep)
  drop
  "${MPI[@]}" -np "$2" "$BIN" --mode restore --reps 1 --dir "$1" --drop-caches --json "$work/r.json" >/dev/null 2>&1
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["restore_s"])' "$work/r.json"
}
ceiling_s() {  # FILE READERS: K parallel direct readers of disjoint ranges
  local size blocks per k t0
  size=$(stat -c %s "$1"); blocks=$(( (size + (16 << 20) - 1) >> 24 )); per=$(( (blocks + $2 - 1) / $2 ))
  drop
  t0=$(now)
  for k in $(seq 0 $(( $2 - 1 ))); do
    dd if="$1" of=/dev/null bs=16M iflag=direct skip=$(( k * per )) count="$per" status=none &
  done
  wait
  awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.6f\n", a - b }'
}
dd_s() {
  local t0
  drop; t0=$(now); dd if="$1" of=/dev/null bs=16M status=none
  awk -v a="$(now)" -v b="$t0" 'BEGIN { printf "%.6f\n", a - b }'
}

echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), sizes $SIZES MiB, ranks $NPS, $REPS reps, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
records=$work/records.jsonl
for mib in $SIZES; do
  for np in $NPS; do
    "${MPI[@]}" -np "$np" "$BIN" --mode save --mib "$mib" --reps 1 --keep --dir "$work/saved-$np" \
      --json "$work/s.json" >/dev/null 2>&1
  done
  for np in $NPS; do
    root=$work/saved-$np
    file=$(find "$root" -name data.h5 | sort | tail -1)
    m=$(next_np "$np")
    for rep in $(seq "$REPS"); do
      r=$(restore_s "$root" "$np")
      c=$(ceiling_s "$file" $(( 4 * np )))
      d=$(dd_s "$file")
      x=$(restore_s "$root" "$m")
      y=$(restore_s "$work/saved-$m" "$m")
      echo "{\"mib\": $mib, \"np\": $np, \"m\": $m, \"restore_s\": $r, \"ceiling_s\": $c, \"dd_s\": $d, \"n_to_m_s\": $x, \"m_to_m_s\": $y}" >>"$records"
    done
  done
  rm -rf "$work"/saved-*
done
[ -n "${OUT:-}" ] && cp "$records" "$OUT"
python3 - "$records" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| MiB | np | restore | ceiling (4 x np direct readers) | restore / ceiling (<= 1.15x) | cold dd / restore (>= 1.0x) | N -> M | N -> M / M -> M (<= 1.1x) |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({(r["mib"], r["np"]) for r in rows})
for mib, np_ in keys:
    rs = [r for r in rows if r["mib"] == mib and r["np"] == np_]
    med = lambda k: statistics.median(r[k] for r in rs)
    ratio = lambda a, b: statistics.median(r[a] / r[b] for r in rs)
    print(f"| {mib} | {np_} | {med('restore_s'):.2f} s | {med('ceiling_s'):.2f} s | {ratio('restore_s', 'ceiling_s'):.2f}x "
          f"| {ratio('dd_s', 'restore_s'):.2f}x | {np_} -> {rs[0]['m']}: {med('n_to_m_s'):.2f} s "
          f"| {ratio('n_to_m_s', 'm_to_m_s'):.2f}x |")
PY
