#!/bin/bash
# The local tier against the machine's limits and against the shared root,
# with nodes simulated on this machine (mhckpt-tier-bench, bench/tier_bench.cc):
# at 1 rank (one node, a core free), 2 ranks (2 nodes of 1) and 4 ranks (2
# nodes of 2), MIB MiB per rank:
#   local commit     Save to WaitUntilFinished of a local-only save, against a
#                    memcpy of the rank's bytes plus an MPI send of them to the
#                    rank that keeps its copy (target: <= 1.5x)
#   stall            the time Save blocks, two tiers against one (target: <= 1.1x)
#   restart          a new manager (processes restarted, nodes' memory intact):
#                    Restore from the local tier into fresh memory, against a
#                    memcpy into fresh memory (target: <= 1.5x)
#   recovery         after the last node's local dir is removed: Restore from
#                    the survivors' files and copies into fresh memory, against
#                    its limit (the fresh memcpy plus the send: <= 1.5x) and a
#                    cold Restore of the same step from the shared root
#                    (target: >= 5x faster)
# Each figure is the slowest rank's, median of REPS. Prints a Markdown table.
#
#   bench/run_tiers.sh [MIB=1024] [REPS=3]
#
# At 4 ranks the run uses MIB4 MiB per rank (default MIB/2): both simulated
# nodes live in this machine's memory, so the local tier holds every byte
# twice (its own file and the other node's copy) beside the processes' own
# buffers, and a new local step is written before the old one is dropped —
# about 5x the checkpoint at once, which 1 GiB per rank at 4 ranks does not
# fit in 24 GiB.
#
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp] (the shared root),
# LOCAL_DIR [/dev/shm] (the nodes' local dirs), OUT (also write the JSON here).
set -euo pipefail
MIB=${1:-1024}
REPS=${2:-3}
MIB4=${MIB4:-$((MIB / 2))}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
LOCAL_DIR=${LOCAL_DIR:-/dev/shm}
BIN=$BUILD_DIR/bin/mhckpt-tier-bench
[ -x "$BIN" ] || { echo "bench/run_tiers.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
     --mca btl_vader_single_copy_mechanism none)

json=$(mktemp)
trap 'rm -f "$json"; rm -rf "$LOCAL_DIR/mhckpt-tier-bench" "$CKPT_DIR/mhckpt-tier-bench"' EXIT
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $MIB MiB per rank ($MIB4 at 4 ranks), $REPS reps, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for case in "1 1" "2 1" "4 2"; do
  read -r np per_node <<<"$case"
  mib=$MIB
  [ "$np" = 4 ] && mib=$MIB4
  "${MPI[@]}" -np "$np" "$BIN" --mib "$mib" --reps "$REPS" --ranks-per-node "$per_node" \
    --dir "$CKPT_DIR/mhckpt-tier-bench" --local "$LOCAL_DIR/mhckpt-tier-bench" \
    --json "$json.$np" >/dev/null 2>&1
  cat "$json.$np" >>"$json"
  rm -f "$json.$np"
done
[ -n "${OUT:-}" ] && cp "$json" "$OUT"
python3 - "$json" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
dec, at, runs = json.JSONDecoder(), 0, []
while at < len(text.strip()):
    r, at = dec.raw_decode(text, at)
    runs.append(r)
    while at < len(text) and text[at].isspace():
        at += 1
print("| ranks (nodes) | MiB per rank | memcpy + send s | local commit s | ratio | stall 1 tier s | stall 2 tiers s | ratio | restart s | / fresh memcpy | recovery s | cold restore s | speed-up |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    nodes = r["ranks"] // r["ranks_per_node"]
    print(f"| {r['ranks']} ({nodes}) | {r['mib_per_rank']} | {r['baseline_s']:.3f} | {r['local_commit_s']:.3f} | "
          f"{r['local_vs_baseline']:.2f}x | {r['stall_one_s']:.3f} | {r['stall_two_s']:.3f} | "
          f"{r['stall_two_vs_one']:.2f}x | {r['restart_restore_s']:.3f} | {r['restart_vs_fresh_memcpy']:.2f}x | "
          f"{r['recovery_restore_s']:.3f} | {r['cold_restore_s']:.3f} | "
          f"{r.get('cold_vs_recovery', 0):.1f}x |")
EOF
