#!/usr/bin/env bash
# The benchmark of docs/PERFORMANCE.md: mhckpt against this machine's own limits
# (memcpy; an fsync'd sequential write of the same random bytes with dd, buffered
# and with oflag=direct; a cold sequential read) and against what users would
# pick instead (Orbax, PyTorch DCP with its default stager and with a cached one,
# a plain h5py collective write), on the same model, the same machine and the
# same file system; and mhckpt's own Python API (mhckpt-py) beside its C++
# figures. Writes the JSON and the Markdown tables first, then the plot (if
# matplotlib is there; skipped with a message otherwise).
#
# Fair to every system: each gets one untimed save and one
# untimed restore first; each timed figure is the median of REPS runs, with min
# and max kept (the disk here has a fast and a slow mode); the page cache is
# dropped before every phase and every timed restore when
# /proc/sys/vm/drop_caches can be written; restores go into freshly allocated,
# untouched memory; and the systems run point by point (dd, mhckpt, then the
# peers at the same size and world size), so that a slow spell of the disk
# does not fall on one system only. mhckpt's C++ destinations of 4 MiB or more
# are advised MADV_HUGEPAGE, as numpy advises the new arrays that h5py and
# mhckpt-py restore into (mhckpt-bench --dest-pages huge, the default).
#
#   bench/run.sh                                  # everything: about 2 hours on 2 cores
#   NPS="1 2" SIZES=256 PEERS=dcp bench/run.sh    # a quick look
#   SIZES="1024 4096" NPS_4096="1 4" bench/run.sh # fewer world sizes at 4 GiB
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]            where scripts/bootstrap.sh builds
#   SKIP_BUILD [0]               1: use the binaries already in BUILD_DIR
#   NPS ["1 2 4"]                world sizes
#   NPS_<MiB>                    world sizes at that size only (default NPS)
#   SIZES ["1024 4096"]          checkpoint size in MiB, all ranks together
#   REPS [5]                     timed repetitions per figure (medians; min and max kept)
#   PEERS ["mhckpt-py orbax dcp dcp-cached h5py"]  peers to run ("" for none; "mhckpt-jax"
#                                too: the Python API with jax.Array leaves); installed into
#                                python/.venv, the Python tests' venv (bench/peers/setup_venv.sh)
#   PEER_SIZES [1024 4096]       sizes the peers run at (each peer start costs 10-40 s)
#   MANY_MIB [1024]              total size of the 10,000-array case ("" to skip it)
#   REPL_SIZES ["256 1024"]      per-rank size of the fully replicated case (np >= 2; "" to skip)
#   SPLIT_BYTES [16777216]       replica_parallel_min_bytes for the split variant
#   CKPT_DIR [/var/tmp/mhckpt-bench]  where checkpoints go (a disk, not tmpfs); emptied after
#   OUT [bench/results/bench-<UTC date>.json.gz]  the combined results (compact
#                                JSON, gzip'd when the name ends .gz); the Markdown tables go
#                                beside it (.md; bench/report.py --from OUT prints them again)
#   PLOT [none]                  a PNG plot of the figures, where one is wanted
#   DROP_CACHES [1]              0: never drop the page cache (warm restores; the JSON says so)
#   STALL [1]                    0: skip the stall phase (bench/run_stall.sh: first save with and
#                                without staging built ahead, lazy saves; OUT's name -stall.json/.md)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
NPS=${NPS:-1 2 4}
SIZES=${SIZES:-1024 4096}
REPS=${REPS:-5}
PEERS=${PEERS-mhckpt-py orbax dcp dcp-cached h5py}
PEER_SIZES=${PEER_SIZES:-1024 4096}
MANY_MIB=${MANY_MIB-1024}
REPL_SIZES=${REPL_SIZES-256 1024}
SPLIT_BYTES=${SPLIT_BYTES:-16777216}
CKPT_DIR=${CKPT_DIR:-/var/tmp/mhckpt-bench}
PLOT=${PLOT:-}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  MHCKPT_BENCH=1 BUILD_DIR=$BUILD_DIR scripts/bootstrap.sh
fi
BIN=$BUILD_DIR/bin/mhckpt-bench
[ -x "$BIN" ] || { echo "bench/run.sh: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
if [ -n "$PEERS" ]; then bench/peers/setup_venv.sh; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# --bind-to none (as the restore scripts of bench/ and the peers' mpirun):
# Open MPI binds each rank to one core at np <= 2 (to a socket above), so at
# np 1 and 2 a rank's I/O threads (the direct reads, the read-ahead, the
# checksums) shared one core with each other and with whatever else ran
# there, while at np 4 they could use any: np 2 was the slow column of every
# restore table, and a restore at 1 of a step saved at 4 looked slower than
# one saved at 1.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

DROP=()
COLD=false
if [ "${DROP_CACHES:-1}" = 1 ] && sync && echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then
  DROP=(--drop-caches); COLD=true
fi
# Before every phase: the same page-cache state for every system (clean page
# cache, dentries and inodes dropped), where the kernel lets us.
drop_caches() { if $COLD; then sync; echo 3 >/proc/sys/vm/drop_caches; fi; }
$COLD || echo "bench/run.sh: the page cache is NOT dropped (DROP_CACHES=0, or /proc/sys/vm/drop_caches not writable)" >&2

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- base worker io coordinator bench python pyproject.toml 2>/dev/null || commit="$commit+dirty"
OUT=${OUT:-bench/results/bench-$(date -u +%Y-%m-%d).json.gz}
export MHCKPT_BENCH_VERSION=$commit  # the version field of the mhckpt-py records
mkdir -p "$CKPT_DIR"
# Room, before anything runs: a phase holds up to four checkpoints of its size
# on disk at once (mhckpt keeps two and writes a third; a reshard phase keeps
# the one saved at N beside them), and the dd source of the largest size lives
# in /dev/shm. A run that fills the disk halfway through loses its hours.
largest=0
for s in $SIZES $MANY_MIB; do s=${s%.*}; [ "$s" -gt "$largest" ] && largest=$s; done
maxnp=1
for n in $NPS; do [ "$n" -gt "$maxnp" ] && maxnp=$n; done
for s in $REPL_SIZES; do s=$(( ${s%.*} * maxnp )); [ "$s" -gt "$largest" ] && largest=$s; done
free_mib() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
need=$(( largest * 4 + 1024 ))
if [ "$(free_mib "$CKPT_DIR")" -lt "$need" ]; then
  echo "bench/run.sh: $CKPT_DIR has $(free_mib "$CKPT_DIR") MiB free; this run needs about $need MiB (4 x $largest MiB + 1 GiB)" >&2
  exit 1
fi
if [ "$(free_mib /dev/shm)" -lt $(( largest + 256 )) ]; then
  echo "bench/run.sh: /dev/shm has $(free_mib /dev/shm) MiB free; the dd source needs $largest MiB" >&2
  exit 1
fi
tmp=$(mktemp -d)
# The dd source: random bytes (not zeros), made once, in tmpfs (memory, not the disk).
random=$(mktemp /dev/shm/mhckpt-bench-random.XXXXXX)
trap 'rm -rf "$tmp" "$random" "$CKPT_DIR"/run.*' EXIT
work=$(mktemp -d "$CKPT_DIR/run.XXXXXX")
start=$(date +%s)
say() { echo "=== $* ($(( $(date +%s) - start )) s) ==="; }
now() { date +%s.%N; }
nps_for() { local v="NPS_$1"; echo "${!v:-$NPS}"; }

# The reshard restore: a checkpoint saved at N is restored at M.
reshard_np() { case $1 in 1) echo 2 ;; 2) echo 4 ;; *) echo 1 ;; esac; }

# ---- This machine's own limits, at MiB $1: an fsync'd sequential write of the
# random bytes, buffered and with oflag=direct, and a cold read of them.
# Written as a series of checkpoints is: a new file each time, the two before it
# still on disk (mhckpt-bench saves with max_to_keep = 2), after one untimed
# write of each mode like every system's first save. On this VM that matters:
# page cache that a deleted file gave back is 3-4x faster to write into than
# pages the guest has not used yet (docs/PERFORMANCE.md). The two modes
# alternate rep by rep, so a slow spell of the disk hits both.
dd_write() {  # FILE MODE MIB
  local flags=(conv=fsync)
  [ "$2" = direct ] && flags+=(oflag=direct)
  dd if="$random" of="$1" bs=16M count=$(( $3 / 16 )) "${flags[@]}" status=none
}
run_dd() {
  local mib=$1 w=() d=() r=() i t0 t1
  say "dd: $mib MiB of random bytes, fsync'd write (buffered, oflag=direct), cold read"
  drop_caches
  dd_write "$work/raw.0" buffered "$mib"
  dd_write "$work/direct.0" direct "$mib"
  for i in $(seq "$REPS"); do
    t0=$(now); dd_write "$work/raw.$i" buffered "$mib"; t1=$(now)
    w+=("$(echo "$t1 - $t0" | bc)")
    rm -f "$work/raw.$(( i - 2 ))"
    t0=$(now); dd_write "$work/direct.$i" direct "$mib"; t1=$(now)
    d+=("$(echo "$t1 - $t0" | bc)")
    rm -f "$work/direct.$(( i - 2 ))"
    drop_caches
    t0=$(now); dd if="$work/raw.$i" of=/dev/null bs=16M status=none; t1=$(now)
    r+=("$(echo "$t1 - $t0" | bc)")
  done
  rm -f "$work"/raw.* "$work"/direct.*
  /usr/bin/python3 - "$tmp/raw-$mib.json" "$mib" "$COLD" "${w[*]}" "${d[*]}" "${r[*]}" <<'EOF'
import json, statistics, sys
out, mib, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true"
w, d, r = ([float(x) for x in a.split()] for a in sys.argv[4:7])
common = {"case": "raw", "np": 1, "mib": mib, "global_bytes": mib << 20, "cold_read": cold, "reps": len(w)}
buffered = dict(common, system="dd", dd_mode="buffered", commit_s=statistics.median(w),
                restore_s=statistics.median(r), samples={"commit_s": w, "restore_s": r},
                notes="dd bs=16M conv=fsync from a file of random bytes in /dev/shm, a new file per rep, "
                      "the 2 before it kept, after one untimed write; read to /dev/null, page cache dropped")
direct = dict(common, system="dd-direct", dd_mode="direct", commit_s=statistics.median(d),
              restore_s=None, samples={"commit_s": d},
              notes="dd bs=16M oflag=direct conv=fsync from the same random file, alternating with the "
                    "buffered writes rep by rep, a new file per rep, the 2 before it kept")
with open(out, "w") as f:
    json.dump([buffered, direct], f)
EOF
}

# ---- mhckpt at MiB $1 and world size $2: save, restore at the same world size,
# restore at another one.
run_mhckpt() {
  local mib=$1 np=$2 m root
  m=$(reshard_np "$np")
  say "mhckpt: $mib MiB, save and restore at np=$np, restore at np=$m"
  root="$work/mhckpt-$np-$mib"
  drop_caches
  "${MPIRUN[@]}" -np "$np" "$BIN" --mode save --mib "$mib" --reps "$REPS" --keep --dir "$root" \
    --version-tag "$commit" --json "$tmp/mhckpt-save-$np-$mib.json"
  drop_caches
  "${MPIRUN[@]}" -np "$np" "$BIN" --mode restore --mib "$mib" --reps "$REPS" --dir "$root" "${DROP[@]}" \
    --version-tag "$commit" --json "$tmp/mhckpt-restore-$np-$mib.json"
  "${MPIRUN[@]}" -np "$m" "$BIN" --mode restore --mib "$mib" --reps "$REPS" --dir "$root" "${DROP[@]}" \
    --version-tag "$commit" --json "$tmp/mhckpt-reshard-$np-$m-$mib.json"
  rm -rf "$root"
}

# ---- The peers at MiB $1 and world size $2, with the same world-size change as
# mhckpt's reshard restore.
run_peers() {
  local mib=$1 np=$2
  say "peers: $PEERS at $mib MiB, np=$np"
  drop_caches
  SKIP_SETUP=1 DROP_CACHES=$($COLD && echo 1 || echo 0) PEERS="$PEERS" NPS="$np" SIZES="$mib" REPS="$REPS" DIR="$work/peers" OUT="$tmp/peers-$np-$mib.json" \
    RESTORE_NP_1=$(reshard_np 1) RESTORE_NP_2=$(reshard_np 2) RESTORE_NP_4=$(reshard_np 4) \
    bench/peers/run_peers.sh || echo "bench/run.sh: some peers failed (see above); the report shows what ran" >&2
}

max_mib=$(printf '%s\n' $SIZES | sort -n | tail -1)
head -c $(( max_mib << 20 )) /dev/urandom >"$random"
for mib in $SIZES; do
  run_dd "$mib"
  for np in $(nps_for "$mib"); do
    run_mhckpt "$mib" "$np"
    if [ -n "$PEERS" ] && [[ " $PEER_SIZES " == *" $mib "* ]]; then run_peers "$mib" "$np"; fi
  done
done
rm -f "$random"

# ---- 10,000 small arrays (each held whole by one rank) against one array of the same bytes.
if [ -n "$MANY_MIB" ]; then
  for np in $NPS; do
    say "mhckpt: 10,000 arrays against one, $MANY_MIB MiB, np=$np"
    drop_caches
    "${MPIRUN[@]}" -np "$np" "$BIN" --mode many --mib "$MANY_MIB" --reps "$REPS" --dir "$work/many-$np" \
      "${DROP[@]}" --version-tag "$commit" --json "$tmp/mhckpt-many-$np.json"
    rm -rf "$work/many-$np"
  done
fi

# ---- Pure data parallel: every array on every rank. Rank 0 writes it all, or the holders split it.
for mib in $REPL_SIZES; do
  for np in $NPS; do
    [ "$np" -ge 2 ] || continue
    for split in 0 "$SPLIT_BYTES"; do
      say "mhckpt: fully replicated, $mib MiB per rank, np=$np, replica_parallel_min_bytes=$split"
      drop_caches
      "${MPIRUN[@]}" -np "$np" "$BIN" --mode replicated --mib "$mib" --reps "$REPS" --dir "$work/repl" \
        --replica-split-bytes "$split" "${DROP[@]}" --version-tag "$commit" \
        --json "$tmp/mhckpt-repl-$np-$mib-$split.json"
      rm -rf "$work/repl"
    done
  done
done

# ---- The stall: the first save with and without staging built ahead, and lazy
# saves beside a compute loop (bench/run_stall.sh; its table goes beside the report).
MD=${OUT%.gz}; MD=${MD%.json}.md
if [ "${STALL:-1}" = 1 ]; then
  say "mhckpt: first save, staging built ahead, lazy saves ($SIZES MiB, np $NPS)"
  mkdir -p "$(dirname "$MD")"
  SIZES="$SIZES" NPS="$NPS" REPS="$REPS" BUILD_DIR="$BUILD_DIR" CKPT_DIR="$work" \
    OUT="${MD%.md}-stall.json" bench/run_stall.sh >"${MD%.md}-stall.md"
  cat "${MD%.md}-stall.md"
fi

say "report"
PLOT_ARGS=()
if [ -n "$PLOT" ]; then mkdir -p "$(dirname "$PLOT")"; PLOT_ARGS=(--plot "$PLOT"); fi
mkdir -p "$(dirname "$OUT")"
# The JSON and the Markdown are written before the plot is tried: a missing
# matplotlib costs the plot only.
/usr/bin/python3 bench/report.py --out "$OUT" --markdown "$MD" ${PLOT_ARGS[@]+"${PLOT_ARGS[@]}"} \
  --note "mhckpt $commit; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" "$tmp"/*.json
echo "bench/run.sh: $(( $(date +%s) - start )) s; results in $OUT and $MD"
