#!/bin/bash
# Saving at every training step (mhckpt-step-bench, bench/step_bench.cc): a
# loop of compute + update of 16 state arrays per rank, without checkpoints,
# with a lazy Save to the local tier at every step and with a blocking one
# (the shared root every EVERY-th save), modes interleaved rep by rep, at
# MIBS MiB per rank, NPS ranks and RATES GB of state per second of training
# (the step lasts state bytes / rate without checkpoints). Targets, np 1,
# lazy: <= 5 % fewer steps/s at 1 GB/s, <= 25 % at 4 GB/s.
#
#   bench/run_every_step.sh                       # MIBS="256 1024" NPS="1 2" RATES="1 4"
#   MIBS=256 NPS=1 RATES=4 REPS=3 bench/run_every_step.sh
#
# Writes the record bench/results/every-step-YYYY-MM-DD.txt (OUT overrides):
# a header object (commit, date, machine, load before and after), then one
# JSON object per case, one a line; prints a Markdown table
# (bench/docs_tables.py every_step prints the same from the record).
# BINS="label=path ..." runs several builds of the bench, one after the other in each
# case (e.g. BINS="before=/tmp/old/mhckpt-step-bench after=build/bin/mhckpt-step-bench"
# for a before/after pair under the same load); each case's object names its build.
# Environment: BUILD_DIR [build], CKPT_DIR [/var/tmp] (the shared root),
# LOCAL_DIR [/dev/shm] (the local tier), STEPS [20], WARMUP [3], REPS [3],
# EVERY [100], MODES [none,lazy,blocking] (also: continuous, a lazy save whenever
# CheckpointManager::ShouldSave says, Options::save_continuously).
set -euo pipefail
MIBS=${MIBS:-256 1024}
NPS=${NPS:-1 2}
RATES=${RATES:-1 4}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
REPS=${REPS:-3}
EVERY=${EVERY:-100}
MODES=${MODES:-none,lazy,blocking}
BUILD_DIR=${BUILD_DIR:-build}
CKPT_DIR=${CKPT_DIR:-/var/tmp}
LOCAL_DIR=${LOCAL_DIR:-/dev/shm}
OUT=${OUT:-bench/results/every-step-$(date -u +%F).txt}
BINS=${BINS:-current=$BUILD_DIR/bin/mhckpt-step-bench}
for b in $BINS; do
  [ -x "${b#*=}" ] || { echo "bench/run_every_step.sh: ${b#*=} not built (MHCKPT_BUILD_BENCH=OFF?)" >&2; exit 1; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
MPI=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
     --mca btl_vader_single_copy_mechanism none)

tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp".one; rm -rf "$CKPT_DIR/mhckpt-step-bench" "$LOCAL_DIR/mhckpt-step-bench"' EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for mib in $MIBS; do
  for np in $NPS; do
    for rate in $RATES; do
      for b in $BINS; do
        "${MPI[@]}" -np "$np" "${b#*=}" --mib "$mib" --rate "$rate" --steps "$STEPS" --warmup "$WARMUP" \
          --reps "$REPS" --every "$EVERY" --modes "$MODES" --root "$CKPT_DIR/mhckpt-step-bench" \
          --local "$LOCAL_DIR/mhckpt-step-bench" --json "$tmp.one" >/dev/null 2>&1
        python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); r["build"] = sys.argv[2]; print(json.dumps(r))' \
          "$tmp.one" "${b%%=*}" >>"$tmp"
      done
    done
  done
done
python3 - "$tmp" "$OUT" "$commit" "$dirty" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$(nproc)" "$(uname -r)" "$STEPS" "$WARMUP" "$REPS" "$EVERY" <<'PY'
import json, sys, datetime
src, out, commit, dirty, lb, la, cores, kernel, steps, warmup, reps, every = sys.argv[1:]
runs = [json.loads(line) for line in open(src) if line.strip()]
head = {"kind": "every-step", "commit": commit, "dirty": dirty == "true",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cores": int(cores), "kernel": kernel, "load_before": lb, "load_after": la,
        "steps": int(steps), "warmup": int(warmup), "reps": int(reps), "persistent_every": int(every),
        "command": "bench/run_every_step.sh"}
with open(out, "w") as f:
    f.write(json.dumps(head) + "\n")
    for r in runs:
        f.write(json.dumps(r) + "\n")
print(f"record {out}: commit {commit}{' (modified)' if dirty == 'true' else ''}, load {lb} -> {la}")
print("| build | MiB/rank | np | GB/s | step | none steps/s | lazy steps/s | lazy slowdown | fence wait | Save call | copy | local | blocking steps/s | blocking slowdown |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
ms = lambda s: f"{s * 1e3:.1f} ms"
for r in runs:
    m = r["modes"]
    n, lz, bl = m.get("none", {}), m.get("lazy", {}), m.get("blocking", {})
    pct = lambda c: f"{c['slowdown_pct']:+.1f} %" if "slowdown_pct" in c else "-"
    print(f"| {r.get('build', '')} | {r['mib']:.0f} | {r['ranks']} | {r['rate_gbps']:g} | {ms(r['step_s'])} "
          f"| {n.get('steps_per_s', 0):.2f} | {lz.get('steps_per_s', 0):.2f} | {pct(lz) if lz else '-'} "
          f"| {ms(lz.get('fence_wait_s', 0))} | {ms(lz.get('save_call_s', 0))} "
          f"| {ms(lz.get('snapshot_s', 0))} | {ms(lz.get('local_s', 0))} "
          f"| {bl.get('steps_per_s', 0):.2f} | {pct(bl) if bl else '-'} |")
PY
# Mode continuous (if run): saves at the steps ShouldSave picks.
python3 - "$OUT" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
runs = [r for r in runs if "continuous" in r.get("modes", {})]
if runs:
    print("\n| build | MiB/rank | np | GB/s | continuous: steps/s | slowdown | saves per step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        c = r["modes"]["continuous"]
        print(f"| {r.get('build', '')} | {r['mib']:.0f} | {r['ranks']} | {r['rate_gbps']:g} "
              f"| {c['steps_per_s']:.2f} | {c.get('slowdown_pct', 0):+.1f} % | {c.get('saves_per_step', 0):.2f} |")
PY
