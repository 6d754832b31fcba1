#!/bin/bash
# What saving blocks a training loop for (mhckpt-stall-bench, bench/stall_bench.cc),
# at SIZES MiB (all ranks together) and NPS ranks, all in one run:
#   first        the first Save of a fresh manager, without and with the staging
#                built ahead (Options::staging_reserve_bytes), against a memcpy of
#                the rank's bytes (target with the hint: <= 1.1x)
#   blocking     a steady Save against the memcpy
#   lazy stall   a steady lazy Save (CopyMode::kLazy) against the memcpy (target: <= 0.1x)
#   fence        Save's start to the end of the lazy copy, while the caller runs a
#                compute loop as long as the memcpy (target: <= 1.5x memcpy), and
#                how much that loop slows down (target: <= 10 %); beside it, the
#                same loop right after a blocking Save (the save's write runs then)
#   extra RSS    peak resident memory beyond the model's and the memcpy target's,
#                less the local bytes (target: <= 64 MiB)
# Each figure is the slowest rank's, median of REPS. Prints a Markdown table.
#
#   bench/run_stall.sh                      # SIZES="1024 4096" NPS="1 2 4" REPS=5
#   SIZES=256 NPS="1 2" REPS=3 bench/run_stall.sh
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp] (checkpoints, removed after),
# LAZY_THREADS [0] (Options::snapshot_threads), OUT (also write the records here, a JSON
# object per line).
set -euo pipefail
SIZES=${SIZES:-1024 4096}
NPS=${NPS:-1 2 4}
REPS=${REPS:-5}
LAZY_THREADS=${LAZY_THREADS:-0}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
BIN=$BUILD_DIR/bin/mhckpt-stall-bench
[ -x "$BIN" ] || { echo "bench/run_stall.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
     --mca btl_vader_single_copy_mechanism none)

json=$(mktemp)
trap 'rm -f "$json" "$json".one; rm -rf "$CKPT_DIR/mhckpt-stall-bench"' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), sizes $SIZES MiB, ranks $NPS, $REPS reps, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for mib in $SIZES; do
  for np in $NPS; do
    "${MPI[@]}" -np "$np" "$BIN" --mib "$mib" --reps "$REPS" --lazy-threads "$LAZY_THREADS" \
      --dir "$CKPT_DIR/mhckpt-stall-bench" --json "$json.one" >/dev/null 2>&1
    python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$json.one" >>"$json"
  done
done
[ -n "${OUT:-}" ] && cp "$json" "$OUT"
python3 - "$json" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
print("| MiB | np | memcpy | first | first, hint | blocking | lazy stall | fence | loop slowdown, lazy | after blocking | extra RSS |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in runs:
    ms = lambda s: f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.2f} ms"
    print(f"| {r['mib']:.0f} | {r['ranks']} | {ms(r['memcpy_s'])} "
          f"| {ms(r['first_s'])} ({r['first_vs_memcpy']:.1f}x) "
          f"| {ms(r['first_hint_s'])} ({r['first_hint_vs_memcpy']:.2f}x) "
          f"| {r['blocking_vs_memcpy']:.2f}x | {ms(r['lazy_stall_s'])} ({r['lazy_stall_vs_memcpy']:.3f}x) "
          f"| {r['fence_vs_memcpy']:.2f}x | {(r['compute_slowdown'] - 1) * 100:+.0f} % "
          f"| {(r['compute_slowdown_blocking'] - 1) * 100:+.0f} % "
          f"| {r['extra_rss_over_local_bytes'] / 2**20:+.0f} MiB |")
PY
