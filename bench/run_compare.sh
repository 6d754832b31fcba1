#!/usr/bin/env bash
# Two commits of the library side by side, interleaved: has a change made
# saves or restores slower? The bench binary (mhckpt-bench) is built at BASE
# in a temporary worktree (git worktree; the build/ of this tree is the other
# side), then, rep by rep and world size by world size, each side saves the
# same model into its own directory, and both restore one and the same file
# (the page cache dropped before each restore), so a slow spell of the disk or
# a luckier file placement does not fall on one side only.
#
#   bench/run_compare.sh BASE                  # e.g. a commit hash or main~10
#   NPS="2 4" MIB=256 REPS=3 bench/run_compare.sh BASE
#
# Settings: NPS (world sizes, "1 2 4"), MIB (global MiB, 1024), REPS (rounds,
# 5; each round's runs time 3 saves and 3 restores), DIR (where checkpoints
# go, /var/tmp/mhckpt-compare), OUT (records, a JSON Lines file). Prints, per
# figure and world size, the median of each side and HEAD / BASE (above 1:
# HEAD is slower). Needs root for dropping the page cache, a built build/
# (scripts/bootstrap.sh) and room for 3 checkpoints of MIB.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: bench/run_compare.sh BASE}
NPS=${NPS:-1 2 4} MIB=${MIB:-1024} REPS=${REPS:-5}
DIR=${DIR:-/var/tmp/mhckpt-compare}
OUT=${OUT:-$DIR/compare.jsonl}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

base_rev=$(git rev-parse --short "$BASE")
head_rev=$(git rev-parse --short HEAD)
tree=$(mktemp -d)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git worktree add --detach -q "$tree" "$base_rev"
echo "== building mhckpt-bench at $base_rev (in $tree)"
cmake -S "$tree" -B "$tree/build" -DMHCKPT_BUILD_TESTS=OFF ${CMAKE_ARGS:-} >/dev/null
cmake --build "$tree/build" -j "$(nproc)" --target mhckpt_bench >/dev/null
cmake --build build -j "$(nproc)" --target mhckpt_bench >/dev/null
declare -A bin=([base]="$tree/build/bin/mhckpt-bench" [head]="build/bin/mhckpt-bench")

mkdir -p "$DIR"
: >"$OUT"
run() {  # run SIDE NP MODE ARGS...: one mhckpt-bench run, its record appended to OUT
  local side=$1 np=$2 mode=$3 rec
  shift 3
  rec=$(mktemp)
  mpirun -np "$np" --mca mpi_yield_when_idle 1 "${bin[$side]}" --mode "$mode" --mib "$MIB" \
    --reps 3 --json "$rec" "$@" >/dev/null 2>&1
  python3 -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    r["side"] = sys.argv[2]
    print(json.dumps(r, separators=(",", ":")))' "$rec" "$side" >>"$OUT"
  rm -f "$rec"
}
for rep in $(seq "$REPS"); do
  for np in $NPS; do
    for side in base head; do
      rm -rf "${DIR:?}/$side"
      mkdir -p "$DIR/$side"
      run "$side" "$np" save --keep --dir "$DIR/$side"
    done
    # Both sides restore the file HEAD wrote (the format is the same).
    for side in base head; do
      run "$side" "$np" restore --drop-caches --dir "$DIR/head"
    done
    echo "round $rep, np $np done"
  done
done

python3 - "$OUT" "$base_rev" "$head_rev" <<'EOF'
import collections, json, statistics, sys
out, base, head = sys.argv[1:]
samples = collections.defaultdict(list)
for line in open(out):
    r = json.loads(line)
    for figure in ("stall_s", "commit_s", "restore_s"):
        if r.get(figure) is not None:
            samples[(figure[:-2], r["np"], r["side"])].append(r[figure])
print(f"| figure | np | {base} (ms) | {head} (ms) | {head} / {base} |")
print("| --- | --- | --- | --- | --- |")
for figure, np in sorted({k[:2] for k in samples}):
    b = statistics.median(samples[(figure, np, "base")])
    h = statistics.median(samples[(figure, np, "head")])
    print(f"| {figure} | {np} | {b * 1e3:.1f} | {h * 1e3:.1f} | {h / b:.2f} |")
EOF
