#!/usr/bin/env bash
# Builds mhckpt (scripts/bootstrap.sh) and runs the snapshot benchmark at
# several world sizes and sizes, writing bench/results/snapshot-<date>.json
# and printing the tables of docs/PERFORMANCE.md.
#
#   bench/run_snapshot.sh                       # np 1 2 4 x 64 256 1024 MiB
#   NPS="1 2" SIZES="64" bench/run_snapshot.sh  # a quick look
#
# Environment (defaults in brackets):
#   BUILD_DIR [build]          where bootstrap.sh builds
#   SKIP_BUILD [0]             1: use the binary already in BUILD_DIR
#   NPS ["1 2 4"]              world sizes
#   SIZES ["64 256 1024"]      sharded state in MiB, all ranks together (= local at np=1)
#   SAVES [11]                 steady-state saves per run (medians)
#   CKPT_DIR [$TMPDIR or /tmp] where checkpoints go (a fresh subdirectory, removed after)
#   OUT [bench/results/snapshot-<UTC date>.json]
#   BENCH_ARGS []              more flags for mhckpt-snapshot-bench
# About 5-8 minutes on 2 cores with the defaults; at most ~6 GiB of RAM.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
NPS=${NPS:-1 2 4}
SIZES=${SIZES:-64 256 1024}
SAVES=${SAVES:-11}
CKPT_DIR=${CKPT_DIR:-${TMPDIR:-/tmp}}
OUT=${OUT:-bench/results/snapshot-$(date -u +%Y-%m-%d).json}
BENCH_ARGS=${BENCH_ARGS:-}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  # CLI11 is the one package the benchmark needs beyond bootstrap.sh's list.
  if ! dpkg-query -W -f='${Status}' libcli11-dev 2>/dev/null | grep -q "install ok installed"; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libcli11-dev
  fi
  BUILD_DIR=$BUILD_DIR scripts/bootstrap.sh
fi
BIN=$BUILD_DIR/bin/mhckpt-snapshot-bench
[ -x "$BIN" ] || { echo "run_snapshot: $BIN not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --mca mpi_yield_when_idle 1
        --mca btl_vader_single_copy_mechanism none)

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- base worker io coordinator 2>/dev/null || commit="$commit+dirty"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The first fsync'd write after an idle spell is the slow one: pay it here.
dd if=/dev/zero of="$CKPT_DIR/mhckpt-bench-warmup.$$" bs=1M count=256 conv=fsync status=none
rm -f "$CKPT_DIR/mhckpt-bench-warmup.$$"

start=$(date +%s)
for mib in $SIZES; do
  for np in $NPS; do
    echo "=== np=$np, $mib MiB ==="
    # shellcheck disable=SC2086
    "${MPIRUN[@]}" -np "$np" "$BIN" --mib "$mib" --saves "$SAVES" --dir "$CKPT_DIR" \
      --json "$tmp/np$np-$mib.json" --note "mhckpt $commit" --np-info $BENCH_ARGS 2>&1 |
      grep -v "mhckpt: step .* committed"
  done
done

mkdir -p "$(dirname "$OUT")"
python3 - "$OUT" "$tmp" "$commit" <<'EOF'
import glob, json, sys, datetime
out, tmp, commit = sys.argv[1], sys.argv[2], sys.argv[3]
runs = [json.load(open(p)) for p in sorted(glob.glob(tmp + "/*.json"))]
doc = {"bench": "snapshot", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "note": f"mhckpt {commit}", "runs": runs}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
EOF
echo
echo "=== summary ($(( $(date +%s) - start )) s; $OUT) ==="
python3 bench/summarize.py "$OUT"
