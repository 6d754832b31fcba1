#!/usr/bin/env bash
# Real runs behind docs/SCALE.md: mhckpt-bench --mode many (ARRAYS arrays of
# MIB MiB in all, sharded over the ranks) at 1, 2, 4, 8, 12 and 16 ranks on this
# machine (oversubscribed above 2), one JSON record per line with the phases of
# the first save (its plan is not cached; from rank 0's log line) added.
#   bench/run_scale.sh [BUILD_DIR] [OUT] [ARRAYS] [MIB]
set -euo pipefail
build=${1:-build}
out=${2:-bench/results/scale-real-$(date -u +%F).jsonl}
arrays=${3:-1000}
mib=${4:-16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
commit=$(git rev-parse --short HEAD)
dir=$(mktemp -d)
: > "$out"
for np in 1 2 4 8 12 16; do
  log="$dir/log.$np"
  mpiexec -n "$np" --oversubscribe --mca mpi_yield_when_idle 1 \
    --mca btl_vader_single_copy_mechanism none "$build/bin/mhckpt-bench" --mode many \
    --arrays "$arrays" --mib "$mib" --reps 2 --dir "$dir" --json "$dir/r.$np.json" > "$log" 2>&1
  /usr/bin/python3 - "$dir/r.$np.json" "$log" "$commit" "$np" "$(cat /proc/loadavg)" >> "$out" <<'PY'
import json, re, sys
records = json.load(open(sys.argv[1]))
r = records["records"][0] if isinstance(records, dict) else records[0]
line = next(l for l in open(sys.argv[2]) if "committed:" in l)  # the first save: many_small
first = {k: float(v) for k, v in re.findall(r"(plan|write|flush|commit|snapshot) ([0-9.]+)", line)}
print(json.dumps({"np": int(sys.argv[4]), "commit": sys.argv[3], "load": sys.argv[5],
                  "first_save_phases_s": first, "record": r}))
PY
  echo "np $np: first save $(grep -m1 'committed:' "$log" | sed 's/.*committed: //')" >&2
done
rm -rf "$dir"
echo "wrote $out" >&2
