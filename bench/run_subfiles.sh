#!/usr/bin/env bash
# Commits with a data file per node against the one shared data.h5, on the
# local Slurm cluster (slurm/local-cluster.sh: 4 nodes on this machine, NPN
# ranks each), interleaved round by round so that a slow spell of the disk
# hits both alike: mhckpt-bench --mode save (the sharded training state of
# docs/PERFORMANCE.md, MIB MiB in all) and --mode many --case many_small
# (10,000 arrays of the same bytes), each with --ranks-per-file 0 (one file)
# and -1 (one per node). Prints a Markdown table of min/median/max commit
# times over every save of every round, and the single/subfiles ratio of the
# medians (above 1: subfiles commit faster); writes the samples to OUT.
#
#   bench/run_subfiles.sh [MIB=1024] [ROUNDS=3] [REPS=5] [OUT]
#
# Environment: BUILD (default build), NPN (ranks per node, default 2), WORK
# (default /var/tmp/mhckpt-subfiles-bench), MHCKPT_SLURM_BASE (default
# /tmp/mhckpt-sub), MHCKPT_SLURM_PORT (default 17300). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-1024}
ROUNDS=${2:-3}
REPS=${3:-5}
commit=$(git rev-parse --short HEAD)
OUT=${4:-bench/results/subfiles-commit-$(date -u +%F).txt}
BUILD=${BUILD:-build}
NPN=${NPN:-2}
WORK=${WORK:-/var/tmp/mhckpt-subfiles-bench}
export MHCKPT_SLURM_BASE=${MHCKPT_SLURM_BASE:-/tmp/mhckpt-sub}
export MHCKPT_SLURM_PORT=${MHCKPT_SLURM_PORT:-17300}
export MHCKPT_SLURM_CPUS=8
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$WORK" && mkdir -p "$WORK/json"
slurm/local-cluster.sh up 4 >/dev/null
export SLURM_CONF=$MHCKPT_SLURM_BASE/slurm.conf
[ "${KEEP_CLUSTER:-0}" = 1 ] || trap 'slurm/local-cluster.sh down >/dev/null 2>&1 || true' EXIT

samples=$WORK/samples.txt
: >"$samples"
for round in $(seq "$ROUNDS"); do
  for mode in save many; do
    for files in 0 -1; do
      json=$WORK/json/$mode-$files-$round.json
      args=(--mode "$mode" --mib "$MIB" --reps "$REPS" --ranks-per-file "$files" --launcher srun
            --dir "$WORK/ckpt" --json "$json")
      [ "$mode" = many ] && args+=(--case many_small)
      for attempt in 1 2 3; do  # Open MPI under srun sometimes fails to start
        srun -N 4 --ntasks-per-node="$NPN" --mpi=pmix --kill-on-bad-exit=1 \
          "$BUILD/bin/mhckpt-bench" "${args[@]}" >"$WORK/log" 2>&1 && break
        echo "round $round $mode $files: launch $attempt failed: $(tail -1 "$WORK/log")" >&2
        [ "$attempt" = 3 ] && exit 1
      done
      /usr/bin/python3 -c "import json,sys
for r in json.load(open(sys.argv[1])):
    for s in r['samples']['commit_s']: print(sys.argv[2], sys.argv[3], s)" \
        "$json" "$mode" "$files" >>"$samples"
      rm -rf "$WORK/ckpt"
    done
  done
done
{
  echo "# bench/run_subfiles.sh $MIB $ROUNDS $REPS at $commit: 4 nodes x $NPN ranks, load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/python3 - "$samples" <<'PY'
import statistics, sys
from collections import defaultdict
s = defaultdict(list)
for line in open(sys.argv[1]):
    mode, files, secs = line.split()
    s[(mode, files)].append(float(secs))
f = lambda v: "%.3f / %.3f / %.3f" % (min(v), statistics.median(v), max(v))
print("| case | one data.h5: commit s (min / median / max) | a file per node | n | one / per node (medians) |")
print("| --- | --- | --- | --- | --- |")
for mode, case in (("save", "sharded"), ("many", "many_small")):
    one, sub = s[(mode, "0")], s[(mode, "-1")]
    print("| %s | %s | %s | %d | %.2f |" % (case, f(one), f(sub), len(sub),
          statistics.median(one) / statistics.median(sub)))
PY
} | tee "$OUT"
