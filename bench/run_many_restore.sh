#!/bin/bash
# Restore of 10,000 small arrays against one array of the same bytes
# (mhckpt-bench --mode many: cases many_small and one_array, each saved and
# then restored at the same np), for one or more builds side by side,
# interleaved round by round so that a slow spell of the disk or a busy CPU
# hits every build alike. Prints a Markdown table of min/median/max restore
# times over every rep of every round, and the many/one ratio of medians.
#
#   bench/run_many_restore.sh [MIB=64] [ROUNDS=2] [REPS=3]
#
# Environment: BINS (default "after=build/bin/mhckpt-bench": "label=path"
# items), FORMATS (checkpoint format versions to save, e.g. "2 3": each build
# is run once per format, labelled label-fN; default: the library's),
# FILES (Options::files.ranks_per_file values, e.g. "0 1": one data file,
# a subfile per rank; each labelled label-sK; default: one file),
# DROP=1 (drop the page cache before each restore: mhckpt-bench --drop-caches,
# as root), CKPT_DIR [/var/tmp/mhckpt-many], NPS ["1 2"].
set -euo pipefail
MIB=${1:-64}
ROUNDS=${2:-2}
REPS=${3:-3}
BINS=${BINS:-"after=build/bin/mhckpt-bench"}
CKPT_DIR=${CKPT_DIR:-/var/tmp/mhckpt-many}
NPS=${NPS:-"1 2"}
FORMATS=${FORMATS:-0}
FILES=${FILES:-0}
drop=
[ "${DROP:-0}" = 1 ] && drop=--drop-caches
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

rm -rf "$CKPT_DIR" && mkdir -p "$CKPT_DIR/json"
out=$CKPT_DIR/samples.txt
: >"$out"
for round in $(seq "$ROUNDS"); do
  for np in $NPS; do
    for item in $BINS; do
      for format in $FORMATS; do
      for files in $FILES; do
        [ "$format" = 2 ] && [ "$files" != 0 ] && continue  # subfiles need format 3
        label=${item%%=*} bin=${item#*=}
        [ "$format" = 0 ] || label=$label-f$format
        [ "$files" = 0 ] || label=$label-s$files
        json=$CKPT_DIR/json/$np-$label-$round.json
        "${MPI[@]}" -np "$np" "$bin" --mode many --mib "$MIB" --reps "$REPS" \
          --dir "$CKPT_DIR/ckpt" --format "$format" --ranks-per-file "$files" $drop \
          --json "$json" >/dev/null
        python3 -c "import json,sys
for r in json.load(open(sys.argv[1])):
    for s in r['samples']['restore_s']: print(sys.argv[2], sys.argv[3], r['case'], s)" \
          "$json" "$np" "$label" >>"$out"
        rm -rf "$CKPT_DIR/ckpt"
      done
      done
    done
  done
done
python3 - "$out" <<'PY'
import statistics, sys
from collections import defaultdict
samples = defaultdict(list)
for line in open(sys.argv[1]):
    np, label, case, secs = line.split()
    samples[(np, label, case)].append(float(secs))
print("| np | build | one_array restore s (min / median / max) | many_small restore s (min / median / max) | n | many / one (medians) |")
print("| --- | --- | --- | --- | --- | --- |")
for (np, label) in sorted({(k[0], k[1]) for k in samples}):
    one, many = samples[(np, label, "one_array")], samples[(np, label, "many_small")]
    f = lambda v: "%.3f / %.3f / %.3f" % (min(v), statistics.median(v), max(v))
    print("| %s | %s | %s | %s | %d | %.2f |" % (np, label, f(one), f(many), len(many),
          statistics.median(many) / statistics.median(one)))
PY
rm -rf "$CKPT_DIR"
