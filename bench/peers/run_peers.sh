#!/usr/bin/env bash
# Runs the peer checkpoint benchmarks (mhckpt's own Python API, Orbax, PyTorch DCP, h5py)
# on the benchmark model and writes one combined JSON list of records (schema:
# bench/peers/README.md).
#
#   bench/peers/run_peers.sh
#   NPS="1 2" SIZES="64 256" REPS=3 PEERS="mhckpt-py orbax dcp h5py" OUT=x.json bench/peers/run_peers.sh
#
# Environment: NPS (default "1 2 4"), SIZES in MiB (default "256 1024 4096"), REPS (3),
# PEERS ("mhckpt-py orbax dcp h5py"; also "mhckpt-jax", the Python API with jax.Array
# leaves, and "dcp-cached", DCP with a stager kept across saves), VENV (python/.venv, made
# by setup_venv.sh; SKIP_SETUP=1: already made, do not run setup_venv.sh), DIR (/tmp/mhckpt-peers; each run
# gets a fresh subdirectory,
# deleted afterwards), OUT (bench/results/peers-<UTC date>.json), TIMEOUT per peer run in
# seconds (900), DROP_CACHES (1 when root: drop the page cache before each restore).
# Restores at a different np: 1->2, 2->1, 4->2, else np/2 (RESTORE_NP_<np> overrides).
# A peer run that fails or times out is reported and skipped; the others continue.
set -uo pipefail
cd "$(dirname "$0")/../.."

NPS=${NPS:-"1 2 4"}
SIZES=${SIZES:-"256 1024 4096"}
REPS=${REPS:-3}
PEERS=${PEERS:-"mhckpt-py orbax dcp h5py"}
VENV=${VENV:-python/.venv}
DIR=${DIR:-/tmp/mhckpt-peers}
OUT=${OUT:-bench/results/peers-$(date -u +%Y-%m-%d).json}
TIMEOUT=${TIMEOUT:-900}
DROP_CACHES=${DROP_CACHES:-$([ "$(id -u)" -eq 0 ] && echo 1 || echo 0)}

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  VENV="$VENV" bench/peers/setup_venv.sh || { echo "run_peers: setup_venv.sh failed" >&2; exit 1; }
fi

restore_np() {
  local v="RESTORE_NP_$1"
  if [ -n "${!v:-}" ]; then echo "${!v}"; return; fi
  case "$1" in 1) echo 2 ;; 2) echo 1 ;; 4) echo 2 ;; *) echo $(( $1 / 2 )) ;; esac
}

mkdir -p "$(dirname "$OUT")" "$DIR"
PARTS=$(mktemp -d)
trap 'rm -rf "$PARTS"' EXIT
failed=()
for mib in $SIZES; do
  for np in $NPS; do
    for peer in $PEERS; do
      extra=()
      case "$peer" in
        h5py) py=/usr/bin/python3; script=h5py_bench.py ;;
        mhckpt-py) py=$VENV/bin/python; script=mhckpt_py_bench.py ;;
        mhckpt-jax) py=$VENV/bin/python; script=mhckpt_py_bench.py; extra=(--leaves jax) ;;
        dcp-cached) py=$VENV/bin/python; script=dcp_bench.py; extra=(--stager cached) ;;
        *) py=$VENV/bin/python; script=${peer}_bench.py ;;
      esac
      run=$(mktemp -d "$DIR/$peer-np$np-$mib.XXXXXX")
      part="$PARTS/$peer-$np-$mib.json"
      flags=(--mib "$mib" --np "$np" --restore-np "$(restore_np "$np")" --dir "$run" --reps "$REPS"
             --json "$part" "${extra[@]}")
      [ "$DROP_CACHES" = 1 ] && flags+=(--drop-caches)
      echo "run_peers: $peer np=$np mib=$mib"
      start=$SECONDS
      # setsid + kill -- -pgid on timeout, so that the peer's worker processes go too.
      timeout --kill-after=30 "$TIMEOUT" setsid "$py" "bench/peers/$script" "${flags[@]}" \
          > "$PARTS/$peer-$np-$mib.log" 2>&1
      rc=$?
      if [ $rc -ne 0 ] || [ ! -s "$part" ]; then
        echo "run_peers: $peer np=$np mib=$mib FAILED (exit $rc after $((SECONDS - start)) s); last lines:" >&2
        grep -v -E '^(WARNING|I0000|E0000)' "$PARTS/$peer-$np-$mib.log" | tail -5 >&2
        failed+=("$peer np=$np mib=$mib")
      else
        tail -1 "$PARTS/$peer-$np-$mib.log"
      fi
      rm -rf "$run"
    done
  done
done

/usr/bin/python3 - "$OUT" "$PARTS" <<'PY'
import glob, json, os, sys
out, parts = sys.argv[1], sys.argv[2]
recs = []
for p in sorted(glob.glob(os.path.join(parts, "*.json"))):
    with open(p) as f:
        recs.extend(json.load(f))
with open(out, "w") as f:
    json.dump(recs, f, indent=1)
print(f"run_peers: {len(recs)} records in {out}")
for r in recs:
    print(f"  {r['system']:10} np={r['np']} ->{r['restore_np']} {r['mib']:>5} MiB  stall {r['stall_s']:.3f} s"
          f"  commit {r['commit_s']:.3f} s  restore {r['restore_s']:.3f} s  reshard "
          f"{(r['reshard_s'] or 0):.3f} s  rss+ {r['peak_rss_extra_bytes'] / 2**20:.0f} MiB"
          f"  verified {r['verified']}")
PY
if [ ${#failed[@]} -gt 0 ]; then
  echo "run_peers: failed: ${failed[*]}" >&2
  exit 1
fi
