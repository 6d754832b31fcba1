#!/usr/bin/env bash
# The benchmark of docs/PERFORMANCE.md: mhckpt against this machine's own limits
# (memcpy, an fsync'd sequential write and a cold sequential read of the same
# bytes with dd) and against what users would pick instead (Orbax, PyTorch DCP,
# a plain h5py collective write), on the same model, the same machine and the
# same file system; and mhckpt's own Python API (mhckpt-py) beside its C++
# figures. Prints the table, writes the JSON and the plot.
#
#   bench/run.sh                                  # everything: about 30 minutes on 2 cores
#   NPS="1 2" SIZES=256 PEERS=dcp bench/run.sh    # a quick look
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]            where scripts/bootstrap.sh builds
#   SKIP_BUILD [0]               1: use the binaries already in BUILD_DIR
#   NPS ["1 2 4"]                world sizes
#   SIZES ["256 1024 4096"]      checkpoint size in MiB, all ranks together
#   REPS [3]                     timed repetitions per figure (medians)
#   PEERS ["mhckpt-py orbax dcp h5py"]  peers to run ("" for none; "mhckpt-jax" too: the
#                                Python API with jax.Array leaves); installed into python/.venv,
#                                the Python tests' venv (bench/peers/setup_venv.sh)
#   PEER_SIZES [1024]            sizes the peers run at (each peer start costs 10-40 s)
#   MANY_MIB [1024]              total size of the 10,000-array case
#   REPL_SIZES ["256 1024"]      per-rank size of the fully replicated case (np >= 2)
#   SPLIT_BYTES [16777216]       replica_parallel_min_bytes for the split variant
#   CKPT_DIR [/var/tmp/mhckpt-bench]  where checkpoints go (a disk, not tmpfs); emptied after
#   OUT [bench/results/bench-<UTC date>.json]    the combined results
#   PLOT [docs/img/bench.png]    the plot
# Restores are timed with a cold page cache when the script can write
# /proc/sys/vm/drop_caches (root); otherwise warm, and the JSON says so.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
NPS=${NPS:-1 2 4}
SIZES=${SIZES:-256 1024 4096}
REPS=${REPS:-3}
PEERS=${PEERS-mhckpt-py orbax dcp h5py}
PEER_SIZES=${PEER_SIZES:-1024}
MANY_MIB=${MANY_MIB:-1024}
REPL_SIZES=${REPL_SIZES:-256 1024}
SPLIT_BYTES=${SPLIT_BYTES:-16777216}
CKPT_DIR=${CKPT_DIR:-/var/tmp/mhckpt-bench}
OUT=${OUT:-bench/results/bench-$(date -u +%Y-%m-%d).json}
PLOT=${PLOT:-docs/img/bench.png}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MHCKPT_BENCH=1 BUILD_DIR=$BUILD_DIR scripts/bootstrap.sh
fi
BIN=$BUILD_DIR/bin/mhckpt-bench
[ -x "$BIN" ] || { echo "bench/run.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
if [ -n "$PEERS" ]; then bench/peers/setup_venv.sh; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

DROP=()
COLD=false
if sync && echo 1 2>/dev/null >/proc/sys/vm/drop_caches; then DROP=(--drop-caches); COLD=true; fi
drop_caches() { if $COLD; then sync; echo 1 >/proc/sys/vm/drop_caches; fi; }

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- base worker io coordinator bench python pyproject.toml 2>/dev/null || commit="$commit+dirty"
export MHCKPT_BENCH_VERSION=$commit  # the version field of the mhckpt-py records
mkdir -p "$CKPT_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$CKPT_DIR"/run.*' EXIT
work=$(mktemp -d "$CKPT_DIR/run.XXXXXX")
start=$(date +%s)
say() { echo "=== $* ($(( $(date +%s) - start )) s) ==="; }
now() { date +%s.%N; }

# The reshard restore: a checkpoint saved at N is restored at M.
reshard_np() { case $1 in 1) echo 2 ;; 2) echo 4 ;; *) echo 1 ;; esac; }

# ---- This machine's own limits: an fsync'd sequential write and a cold read of the same bytes.
# The first fsync'd write after an idle spell is the slow one: pay it here.
dd if=/dev/zero of="$work/warmup" bs=1M count=256 conv=fsync status=none && rm -f "$work/warmup"
for mib in $SIZES; do
  say "dd: $mib MiB, write with fsync and cold read"
  # Written as a series of checkpoints is: a new file each time, the two
  # before it still on disk (mhckpt-bench saves with max_to_keep = 2), after
  # one untimed warm-up like mhckpt's first save. On this VM that matters:
  # page cache that a deleted file gave back is 3-4x faster to write into
  # than pages the guest has not used yet (docs/PERFORMANCE.md).
  w=() r=()
  dd if=/dev/zero of="$work/raw.0" bs=16M count=$(( mib / 16 )) conv=fsync status=none
  for i in $(seq "$REPS"); do
    t0=$(now); dd if=/dev/zero of="$work/raw.$i" bs=16M count=$(( mib / 16 )) conv=fsync status=none; t1=$(now)
    w+=("$(echo "$t1 - $t0" | bc)")
    rm -f "$work/raw.$(( i - 2 ))"
    drop_caches
    t0=$(now); dd if="$work/raw.$i" of=/dev/null bs=16M status=none; t1=$(now)
    r+=("$(echo "$t1 - $t0" | bc)")
  done
  rm -f "$work"/raw.*
  /usr/bin/python3 - "$tmp/raw-$mib.json" "$mib" "$COLD" "${w[*]}" "${r[*]}" <<'EOF'
import json, statistics, sys
out, mib, cold, w, r = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true", sys.argv[4], sys.argv[5]
w = [float(x) for x in w.split()]; r = [float(x) for x in r.split()]
json.dump([{"system": "dd", "case": "raw", "np": 1, "mib": mib, "global_bytes": mib << 20,
            "commit_s": statistics.median(w), "restore_s": statistics.median(r), "cold_read": cold,
            "reps": len(w), "samples": {"commit_s": w, "restore_s": r},
            "notes": "dd bs=16M conv=fsync from /dev/zero, a new file per rep, the 2 before it kept; read to /dev/null"}], open(out, "w"))
EOF
done

# ---- mhckpt: save, restore at the same world size, restore at another one.
for mib in $SIZES; do
  for np in $NPS; do
    m=$(reshard_np "$np")
    say "mhckpt: $mib MiB, save and restore at np=$np, restore at np=$m"
    root="$work/mhckpt-$np-$mib"
    "${MPIRUN[@]}" -np "$np" "$BIN" --mode save --mib "$mib" --reps "$REPS" --keep --dir "$root" \
      --version-tag "$commit" --json "$tmp/mhckpt-save-$np-$mib.json"
    "${MPIRUN[@]}" -np "$np" "$BIN" --mode restore --mib "$mib" --reps "$REPS" --dir "$root" "${DROP[@]}" \
      --version-tag "$commit" --json "$tmp/mhckpt-restore-$np-$mib.json"
    "${MPIRUN[@]}" -np "$m" "$BIN" --mode restore --mib "$mib" --reps "$REPS" --dir "$root" "${DROP[@]}" \
      --version-tag "$commit" --json "$tmp/mhckpt-reshard-$np-$m-$mib.json"
    rm -rf "$root"
  done
done

# ---- 10,000 small arrays against one array of the same bytes.
for np in $NPS; do
  say "mhckpt: 10,000 arrays against one, $MANY_MIB MiB, np=$np"
  "${MPIRUN[@]}" -np "$np" "$BIN" --mode many --mib "$MANY_MIB" --reps "$REPS" --dir "$work/many-$np" \
    "${DROP[@]}" --version-tag "$commit" --json "$tmp/mhckpt-many-$np.json"
  rm -rf "$work/many-$np"
done

# ---- Pure data parallel: every array on every rank. Rank 0 writes it all, or the holders split it.
for mib in $REPL_SIZES; do
  for np in $NPS; do
    [ "$np" -ge 2 ] || continue
    for split in 0 "$SPLIT_BYTES"; do
      say "mhckpt: fully replicated, $mib MiB per rank, np=$np, replica_parallel_min_bytes=$split"
      "${MPIRUN[@]}" -np "$np" "$BIN" --mode replicated --mib "$mib" --reps "$REPS" --dir "$work/repl" \
        --replica-split-bytes "$split" "${DROP[@]}" --version-tag "$commit" \
        --json "$tmp/mhckpt-repl-$np-$mib-$split.json"
      rm -rf "$work/repl"
    done
  done
done

# ---- Peers on the same model.
if [ -n "$PEERS" ]; then
  say "peers: $PEERS"
  # The same world-size changes as mhckpt's reshard restores above.
  PEERS="$PEERS" NPS="$NPS" SIZES="$PEER_SIZES" REPS="$REPS" DIR="$work/peers" OUT="$tmp/peers.json" \
    RESTORE_NP_1=$(reshard_np 1) RESTORE_NP_2=$(reshard_np 2) RESTORE_NP_4=$(reshard_np 4) \
    bench/peers/run_peers.sh || echo "bench/run.sh: some peers failed (see above); the report shows what ran" >&2
fi

say "report"
mkdir -p "$(dirname "$OUT")" "$(dirname "$PLOT")"
/usr/bin/python3 bench/report.py --out "$OUT" --plot "$PLOT" --note "mhckpt $commit" "$tmp"/*.json
echo "bench/run.sh: $(( $(date +%s) - start )) s; results in $OUT, plot in $PLOT"
