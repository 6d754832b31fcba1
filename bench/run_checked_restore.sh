#!/bin/bash
# The cost of checking every byte a restore returns (RestoreOptions::
# verify_checksums, docs/PERFORMANCE.md "Measurements behind the defaults"): for each chunk
# size, the training state of --mib MiB is saved at np 2 and at np 3, then
# restored at np 2 (the same world size, and 3 -> 2) with and without the
# check, --reps times each, alternating. One JSON record per restore run.
#
#   bench/run_checked_restore.sh [MIB] [REPS] [CHUNK_BYTES...]
#   (defaults: 256 MiB, 7 reps, chunks of 256 KiB, 1 MiB, 4 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-256}
REPS=${2:-7}
shift $(($# > 2 ? 2 : $#))
CHUNKS=(262144 1048576 4194304)
[ $# -gt 0 ] && CHUNKS=("$@")
BENCH=build/bin/mhckpt-bench
WORK=${WORK:-build/bench-checked}
OUT=${OUT:-$WORK/checked_restore.json}
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
     --mca btl_vader_single_copy_mechanism none)
rm -rf "$WORK" && mkdir -p "$WORK"
records=()
for chunk in "${CHUNKS[@]}"; do
  for saved in 2 3; do
    dir=$WORK/c${chunk}_np${saved}
    "${MPI[@]}" -np "$saved" "$BENCH" --mode save --mib "$MIB" --reps 1 --keep \
      --chunk-bytes "$chunk" --dir "$dir" --json "$dir.save.json" >/dev/null
    for rep in 1 2; do  # alternate, so drift on a shared machine hits both alike
      for check in on off; do
        flag=()
        [ "$check" = off ] && flag=(--no-verify-checksums)
        json=$dir.restore_${check}_${rep}.json
        "${MPI[@]}" -np 2 "$BENCH" --mode restore --dir "$dir" --reps "$REPS" "${flag[@]}" \
          --note "chunk_bytes=$chunk" --json "$json" >/dev/null
        records+=("$json")
      done
    done
    rm -rf "$dir/mhckpt-bench-sharded"
  done
done
python3 - "$OUT" "${records[@]}" <<'EOF'
import json, statistics, sys
out, paths = sys.argv[1], sys.argv[2:]
rows = {}
for p in paths:
    for r in json.load(open(p)):
        chunk = int(r["notes"].split("chunk_bytes=")[1].split()[0].rstrip(";"))
        key = (chunk, r["saved_np"], r["verify_checksums"])
        rows.setdefault(key, []).extend(r["samples"]["restore_s"])
table = []
for (chunk, saved, check), s in sorted(rows.items()):
    table.append({"chunk_bytes": chunk, "saved_np": saved, "restore_np": 2, "check": check,
                  "n": len(s), "min_s": min(s), "median_s": statistics.median(s),
                  "max_s": max(s)})
    print(f"chunk {chunk:>8}  {saved}->2  check {'on ' if check else 'off'}  n={len(s)}  "
          f"min {min(s):.3f}  median {statistics.median(s):.3f}  max {max(s):.3f} s")
json.dump(table, open(out, "w"), indent=1)
EOF
