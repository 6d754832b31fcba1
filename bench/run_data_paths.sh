#!/bin/bash
# Save-to-commit of one checkpoint through each data path (Options::data_path:
# direct, buffered, hdf5) and writer thread count, at np 1 and 2, against dd
# of the same bytes from a random file (buffered + conv=fsync, and
# oflag=direct), interleaved round by round so that a slow spell of the disk
# hits every case alike. Prints a Markdown table of min/median/max.
#
#   bench/run_data_paths.sh [MIB=1024] [ROUNDS=3] [REPS=2]
#
# Each round runs dd once per mode and mhckpt-bench --mode save --reps REPS
# once per case (its first save, into fresh staging memory, is reported apart
# and not counted). Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp/mhckpt-paths],
# NPS ["1 2"], CASES (default below: "path:threads" items).
set -euo pipefail
MIB=${1:-1024}
ROUNDS=${2:-3}
REPS=${3:-2}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp/mhckpt-paths}
NPS=${NPS:-"1 2"}
CASES=${CASES:-"direct:1 direct:2 direct:4 buffered:2 buffered:4 hdf5:0"}
BIN=$BUILD_DIR/bin/mhckpt-bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

rm -rf "$CKPT_DIR" && mkdir -p "$CKPT_DIR/dd" "$CKPT_DIR/json"
out=$CKPT_DIR/samples.txt
: >"$out"
head -c $((MIB << 20)) /dev/urandom >"$CKPT_DIR/random.bin"  # stays in the page cache
now() { date +%s.%N; }
for round in $(seq "$ROUNDS"); do
  for mode in fsync direct; do
    flag=(conv=fsync)
    [ "$mode" = direct ] && flag=(oflag=direct conv=fsync)
    rm -f "$CKPT_DIR/dd/out"
    t0=$(now)
    dd if="$CKPT_DIR/random.bin" of="$CKPT_DIR/dd/out" bs=64M "${flag[@]}" status=none
    t1=$(now)
    echo "dd_$mode - $(echo "$t1 - $t0" | bc)" >>"$out"
  done
  rm -f "$CKPT_DIR/dd/out"
  for np in $NPS; do
    for c in $CASES; do
      path=${c%%:*} threads=${c##*:}
      json=$CKPT_DIR/json/$np-$path-$threads-$round.json
      "${MPI[@]}" -np "$np" "$BIN" --mode save --mib "$MIB" --reps "$REPS" --data-path "$path" \
        --writer-threads "$threads" --dir "$CKPT_DIR/ckpt" --json "$json" >/dev/null
      python3 -c "import json,sys; r=json.load(open(sys.argv[1]))[0]
for s in r['samples']['commit_s']: print('mhckpt_np%s_%s_t%s' % (sys.argv[2], sys.argv[3], sys.argv[4]), '-', s)" \
        "$json" "$np" "$path" "$threads" >>"$out"
      rm -rf "$CKPT_DIR/ckpt"
    done
  done
done
python3 - "$out" "$MIB" <<'PY'
import statistics, sys
from collections import defaultdict
samples = defaultdict(list)
for line in open(sys.argv[1]):
    name, _, secs = line.split()
    samples[name].append(float(secs))
mib = float(sys.argv[2])
base = statistics.median(samples["dd_fsync"])
print("| case | n | min s | median s | max s | GB/s (median) | dd conv=fsync / case |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, v in samples.items():
    m = statistics.median(v)
    print("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
        name, len(v), min(v), m, max(v), mib * 2**20 / m / 1e9, base / m))
PY
rm -rf "$CKPT_DIR"
