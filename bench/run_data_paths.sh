#!/usr/bin/env bash
# The layout choice, measured: save-to-commit (and a warm
# restore) of one checkpoint through each data path (Options::data_path:
# direct, buffered, hdf5) and writer thread count (Options::writer_threads),
# at each world size, on each file system in FS_DIRS (a disk and a tmpfs),
# against dd of the same bytes from a random file in /dev/shm (buffered +
# conv=fsync, and oflag=direct). Then the upper bound of one file per rank:
# NP dd writers each writing its 1/NP of the bytes into its own file against
# NP writers into disjoint ranges of one shared file, buffered and O_DIRECT,
# each fsync'd. Everything is interleaved round by round, so that a slow spell
# of the disk hits every case alike. Prints Markdown tables (min/median/max)
# and writes every sample to a JSON file (first).
#
#   bench/run_data_paths.sh                     # about 40 minutes at 1 GiB on 2 cores (ROUNDS=1 REPS=5: 25)
#   MIB=256 ROUNDS=1 REPS=2 NPS="1 2" FS_DIRS=/dev/shm/x bench/run_data_paths.sh   # a quick look
#   bench/run_data_paths.sh --report bench/results/data-paths-....json            # the tables again
#
# Environment (defaults in brackets):
#   MIB [1024]                checkpoint size, all ranks together
#   ROUNDS [2]                interleaved rounds; samples per case = ROUNDS * REPS
#   REPS [3]                  timed saves per mhckpt-bench run (its first save,
#                             into fresh staging memory, is not counted)
#   NPS ["1 2 4"]             world sizes
#   CASES                     "path:threads" items (below); hdf5 ignores writer_threads
#   FS_DIRS ["/var/tmp/mhckpt-paths /dev/shm/mhckpt-paths"]  where checkpoints go
#   BUILD_DIR [build]
#   OUT [bench/results/data-paths-<UTC date>.json]
set -euo pipefail
cd "$(dirname "$0")/.."

MIB=${MIB:-1024}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
NPS=${NPS:-1 2 4}
CASES=${CASES:-direct:1 direct:2 direct:4 direct:8 buffered:1 buffered:2 buffered:4 buffered:8 hdf5:0}
FS_DIRS=${FS_DIRS:-/var/tmp/mhckpt-paths /dev/shm/mhckpt-paths}
BUILD_DIR=${BUILD_DIR:-build}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- base worker io coordinator bench 2>/dev/null || commit="$commit+dirty"
OUT=${OUT:-bench/results/data-paths-$(date -u +%Y-%m-%d).json}
BIN=$BUILD_DIR/bin/mhckpt-bench

# The Markdown tables of a results JSON (this script's OUT): per file system
# and world size, every case's min/median/max and its median throughput against
# one dd writing all the bytes on the same file system.
report() {
  /usr/bin/python3 - "$1" <<'PY'
import collections, json, statistics, sys

doc = json.load(open(sys.argv[1]))
s = {(x["fs"], x["np"], x["case"], x["kind"]): x["s"] for x in doc["samples"]}
gb = doc["mib"] * 2**20 / 1e9


def med(fs, np_, case, kind="commit"):
    v = s.get((fs, np_, case, kind))
    return statistics.median(v) if v else None


for fs in sorted({k[0] for k in s}):
    ddb, ddd = med(fs, 1, "dd_buffered_files"), med(fs, 1, "dd_direct_files")
    for np_ in sorted({k[1] for k in s if k[0] == fs}):
        print(f"\n{fs}, np {np_}, {doc['mib']} MiB (commit {doc['commit']}, load average {' '.join(doc['loadavg'])} "
              "at the end). Ratios: dd time / case time for the same bytes, dd = one writer at np 1 "
              "(> 1: the case is faster)\n")
        print("| case | n | commit min / median / max s | GB/s | vs dd buffered | vs dd direct "
              "| no retention, median s | restore right after, s |")
        print("|---|---|---|---|---|---|---|---|")
        for (f_, n_, case, kind), v in sorted(s.items()):
            if f_ != fs or n_ != np_ or kind != "commit":
                continue
            m = statistics.median(v)
            ratio = lambda base: f"{base / m:.2f}×" if base else "—"  # noqa: E731
            nr, wr = med(fs, np_, case, "commit_no_retention"), med(fs, np_, case, "warm_restore")
            print(f"| {case} | {len(v)} | {min(v):.2f} / **{m:.2f}** / {max(v):.2f} | {gb / m:.2f} | "
                  f"{ratio(ddb)} | {ratio(ddd)} | {'—' if nr is None else f'{nr:.2f}'} | "
                  f"{'—' if wr is None else f'{wr:.2f}'} |")
print(f"\n(from {sys.argv[1]}; 'restore right after': one restore by the same job right after its saves, "
      "into touched memory; the page cache still holds the bytes after buffered and HDF5 writes, not after "
      "O_DIRECT ones)")
PY
}

if [ "${1:-}" = --report ]; then report "$2"; exit 0; fi
[ -x "$BIN" ] || { echo "run_data_paths: $BIN not built" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none)

tmp=$(mktemp -d)
random=/dev/shm/mhckpt-paths-random.bin
cleanup() {
  rm -rf "$tmp" "$random"
  for d in $FS_DIRS; do rm -rf "$d"; done
}
trap cleanup EXIT
samples=$tmp/samples.tsv  # fs, case, np, seconds, kind
: >"$samples"
head -c $((MIB << 20)) /dev/urandom >"$random"
now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc; }

# dd of the bytes of `np` writers (NP, MODE, LAYOUT, DIR): each writer writes
# MIB/NP MiB of the random file, into its own file ("files") or into its
# range of one shared file ("shared"), buffered or with oflag=direct, and
# fsyncs. Prints the wall time of all of them.
dd_writers() {
  local np=$1 mode=$2 layout=$3 dir=$4 part=$(( MIB / $1 )) flags=(conv=fsync,notrunc) pids=() i
  [ "$mode" = direct ] && flags+=(oflag=direct)
  rm -f "$dir"/dd.*
  local t0; t0=$(now)
  for i in $(seq 0 $(( np - 1 ))); do
    if [ "$layout" = files ]; then
      dd if="$random" of="$dir/dd.$i" bs=16M count=$(( part / 16 )) skip=$(( i * part / 16 )) \
        "${flags[@]}" status=none &
    else
      dd if="$random" of="$dir/dd.shared" bs=16M count=$(( part / 16 )) skip=$(( i * part / 16 )) \
        seek=$(( i * part / 16 )) "${flags[@]}" status=none &
    fi
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  elapsed "$t0" "$(now)"
  rm -f "$dir"/dd.*
}

start=$(date +%s)
for round in $(seq "$ROUNDS"); do
  for dir in $FS_DIRS; do
    mkdir -p "$dir"
    fs=$(stat -f -c %T "$dir" | tr -c "a-z0-9\n" _)  # "ext2/ext3" -> ext2_ext3
    # tmpfs refuses O_DIRECT: only buffered dd there.
    modes="buffered direct"
    [ "$fs" = tmpfs ] && modes=buffered
    echo "=== round $round, $dir ($fs) ($(( $(date +%s) - start )) s) ==="
    for np in $NPS; do
      for mode in $modes; do
        for layout in files shared; do
          # At np 1 the two layouts are the same thing: one writer, one file.
          [ "$np" = 1 ] && [ "$layout" = shared ] && continue
          for rep in $(seq "$REPS"); do
            printf '%s\tdd_%s_%s\t%s\t%s\tcommit\n' "$fs" "$mode" "$layout" "$np" \
              "$(dd_writers "$np" "$mode" "$layout" "$dir")" >>"$samples"
          done
        done
      done
      for c in $CASES; do
        path=${c%%:*} threads=${c##*:}
        json=$tmp/$fs-$np-$path-$threads-$round.json
        "${MPI[@]}" -np "$np" "$BIN" --mode save --mib "$MIB" --reps "$REPS" --data-path "$path" \
          --writer-threads "$threads" --dir "$dir/ckpt" --version-tag "$commit" --json "$json" >/dev/null
        /usr/bin/python3 - "$json" "$fs" "$path" "$threads" "$np" >>"$samples" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[0]
fs, path, threads, np_ = sys.argv[2:]
name = f"mhckpt_{path}" + ("" if path == "hdf5" else f"_t{threads}")
for s in r["samples"]["commit_s"]:
    print(f"{fs}\t{name}\t{np_}\t{s}\tcommit")
for s, g in zip(r["samples"]["commit_s"], r["samples"]["gc_s"]):
    print(f"{fs}\t{name}\t{np_}\t{s - g}\tcommit_no_retention")
print(f"{fs}\t{name}\t{np_}\t{r['verify_restore_s']}\twarm_restore")
PY
        rm -rf "$dir/ckpt"
      done
    done
  done
done

# The JSON of every sample, then the tables from it.
/usr/bin/python3 - "$samples" "$MIB" "$OUT" "$commit" "$ROUNDS" "$REPS" <<'PY'
import collections, datetime, json, os, sys

path, mib, out, commit, rounds, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
s = collections.defaultdict(list)
for line in open(path):
    fs, case, np_, secs, kind = line.rstrip("\n").split("\t")
    s[(fs, int(np_), case, kind)].append(float(secs))
doc = {"bench": "data_paths", "commit": commit, "mib": mib, "rounds": int(rounds), "reps": int(reps),
       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "loadavg": open("/proc/loadavg").read().split()[:3],
       "samples": [{"fs": k[0], "np": k[1], "case": k[2], "kind": k[3], "s": v} for k, v in sorted(s.items())]}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
PY
report "$OUT"
