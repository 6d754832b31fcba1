#!/usr/bin/env bash
# The README's first command. Builds mhckpt (scripts/bootstrap.sh), then runs
# mhckpt-train-demo, a small MLP whose weights and Adam state are sharded by
# rows across MPI ranks and checkpointed asynchronously:
#   1. trains at 4 ranks in a fresh directory, and stops;
#   2. resumes at 3 ranks from the latest committed step, and stops;
#   3. resumes at 2 ranks the same way;
# checks that every restore reproduces the committed state bit for bit (the
# fingerprint printed at restore equals the one printed at commit) and that
# the loss keeps falling, then shows the checkpoint with `mhckpt verify`,
# `mhckpt list` and `h5ls -r`. Fails loudly (non-zero) if any check fails.
#
# Environment: MHCKPT_DEMO_DIR (default build/demo-ckpt), MHCKPT_DEMO_MIB
# (sharded state size, default 64), MHCKPT_DEMO_STEPS (steps per run, default
# 100), BUILD_DIR (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
DIR=${MHCKPT_DEMO_DIR:-$BUILD_DIR/demo-ckpt}
MIB=${MHCKPT_DEMO_MIB:-64}
STEPS=${MHCKPT_DEMO_STEPS:-100}
SAVE_EVERY=$(( STEPS / 4 > 0 ? STEPS / 4 : 1 ))
LOGS=$BUILD_DIR/demo-logs
START=$SECONDS

fail() {
  echo "demo: FAILED: $*" >&2
  exit 1
}

echo "== bootstrap: packages and build into $BUILD_DIR/ (log: $LOGS/bootstrap.log)"
mkdir -p "$LOGS"
if ! BUILD_DIR=$BUILD_DIR scripts/bootstrap.sh demo >"$LOGS/bootstrap.log" 2>&1; then
  tail -n 30 "$LOGS/bootstrap.log" >&2
  fail "scripts/bootstrap.sh (full log: $LOGS/bootstrap.log)"
fi
DEMO=$BUILD_DIR/bin/mhckpt-train-demo
CLI=$BUILD_DIR/bin/mhckpt
[ -x "$DEMO" ] && [ -x "$CLI" ] || fail "the build did not produce $DEMO and $CLI"

if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Oversubscribed on small machines; waiting ranks yield instead of spinning.
MPIRUN=(mpirun --oversubscribe --mca mpi_yield_when_idle 1
        --mca btl_vader_single_copy_mechanism none)

rm -rf "$DIR"

# train RUN RANKS UNTIL FLAGS...: one job; its output goes to the terminal
# (without the library's own log lines) and to $LOGS/runRUN.log.
train() {
  local run=$1 ranks=$2 until=$3
  shift 3
  echo
  echo "== run $run: $ranks ranks, until step $until $*"
  set +e
  "${MPIRUN[@]}" -np "$ranks" "$DEMO" --dir "$DIR" --steps "$until" \
    --save-every "$SAVE_EVERY" --max-to-keep 3 "$@" 2>&1 | tee "$LOGS/run$run.log" |
    grep -v '\] mhckpt: '
  local status=${PIPESTATUS[0]}
  set -e
  [ "$status" -eq 0 ] || fail "run $run exited with status $status (log: $LOGS/run$run.log)"
}

train 1 4 "$STEPS" --model-mib "$MIB"
train 2 3 $(( 2 * STEPS )) --resume
train 3 2 $(( 3 * STEPS )) --resume

# The fingerprint of STEP printed in LOG after the line starting with WHAT
# ("committed" when the save committed, "restored" after a restore).
fingerprint() {
  awk -v what="$2 step=$3" -v fp="fingerprint step=$3" '
    index($0, what) == 1 && substr($0, length(what) + 1, 1) ~ /[: ]/ { seen = 1; next }
    seen && index($0, fp " ") == 1 { print $3; exit }' "$1"
}
last_committed() { sed -n 's/^committed step=\([0-9]*\):.*/\1/p' "$1" | tail -n 1; }
restored_step() { sed -n 's/^restored step=\([0-9]*\) .*/\1/p' "$1" | head -n 1; }
# Mean loss of the last three loss lines of LOG (the last 30 steps by default).
late_loss() { awk '/^step [0-9]+ loss /{l[n++]=$4} END{if(n<3)exit 1; printf "%.6f", (l[n-1]+l[n-2]+l[n-3])/3}' "$1"; }
first_loss() { awk '/^step [0-9]+ loss /{print $4; exit}' "$1"; }

echo
echo "== checks"
ranks=(0 4 3 2)
for run in 2 3; do
  prev=$(( run - 1 ))
  want=$(last_committed "$LOGS/run$prev.log")
  got=$(restored_step "$LOGS/run$run.log")
  [ -n "$want" ] || fail "run $prev committed nothing"
  [ "$got" = "$want" ] || fail "run $run restored step '$got', the latest committed was $want"
  committed=$(fingerprint "$LOGS/run$prev.log" committed "$want")
  restored=$(fingerprint "$LOGS/run$run.log" restored "$want")
  [ -n "$committed" ] && [ "$committed" = "$restored" ] ||
    fail "step $want: committed at ${ranks[$prev]} ranks as '$committed', restored at ${ranks[$run]} ranks as '$restored'"
  echo "step $want: committed at ${ranks[$prev]} ranks, restored at ${ranks[$run]} ranks:" \
       "fingerprint $committed both times: OK"
done

start_loss=$(first_loss "$LOGS/run1.log")
l1=$(late_loss "$LOGS/run1.log") && l2=$(late_loss "$LOGS/run2.log") &&
  l3=$(late_loss "$LOGS/run3.log") || fail "too few loss lines in the logs"
echo "loss: $start_loss at the start; mean of the last 30 steps of each run: $l1 (4 ranks)," \
     "$l2 (3 ranks), $l3 (2 ranks)"
awk -v a="$start_loss" -v b="$l1" -v c="$l2" -v d="$l3" 'BEGIN{exit !(a > b && b > c && c > d)}' ||
  fail "the loss did not keep falling across the runs"
echo "loss keeps falling across restarts: OK"

latest=$(last_committed "$LOGS/run3.log")
echo
echo "== $CLI verify $DIR --all"
"$CLI" verify "$DIR" --all || fail "mhckpt verify"
echo
echo "== $CLI list $DIR"
"$CLI" list "$DIR"
echo
echo "== h5ls -r $DIR/step_$(printf %010d "$latest")/data.h5"
h5ls -r "$DIR/step_$(printf %010d "$latest")/data.h5"
echo
echo "demo: OK in $(( SECONDS - START )) s (logs in $LOGS/)"
