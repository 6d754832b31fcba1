#!/usr/bin/env bash
# The plan-round figures of docs/SCALE.md: mhckpt-plan-sim over ranks x arrays
# for the 70B layout (TP 8 x PP 4) and the 400B layout (TP 8 x PP 8) at 8,000
# ranks, replica-parallel at 16 MiB slices; one JSON record per line.
#   bench/run_plan_sim.sh [BUILD_DIR] [OUT]
set -euo pipefail
build=${1:-build}
out=${2:-bench/results/plan-sim-$(date -u +%F).jsonl}
sim="$build/bin/mhckpt-plan-sim"
commit=$(git rev-parse --short HEAD)
: > "$out"
run() {
  local tmp
  tmp=$(mktemp)
  "$sim" "$@" --rp-min-bytes 16777216 --json "$tmp" >&2
  /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["commit"]=sys.argv[2]; r["args"]=sys.argv[3:]; print(json.dumps(r))' \
    "$tmp" "$commit" "$@" >> "$out"
  rm -f "$tmp"
}
for arrays in 1000 10000; do
  for ranks in 256 1024 4096 8000; do
    run --model 70b --ranks "$ranks" --arrays "$arrays"
  done
done
run --model 70b --ranks 8000 --arrays 3000
run --model 400b --ranks 8000 --arrays 10000
# Without deduplication (every description decoded on rank 0), where memory allows.
run --model 70b --ranks 256 --arrays 10000 --full
run --model 70b --ranks 1024 --arrays 1000 --full
echo "wrote $out" >&2
