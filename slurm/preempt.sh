#!/usr/bin/env bash
# Preemption on a real Slurm cluster (slurm/local-cluster.sh: 3 nodes on this
# machine): the demo runs with --preemption (SIGTERM and SIGUSR1 are notices,
# CheckpointManager::ReachedPreemption), one rank per node, and
#
#   A: 2 nodes, fresh; `scancel --signal=USR1 JOB` mid-run (every task gets
#      it): every rank stops at the same step, saves it and exits 0
#   B: 2 nodes, --resume from A's preemption step; `kill -USR1` of one task's
#      pid only (the other rank gets no signal): the same, at a later step
#   C: 3 nodes, --resume from B's preemption step, trains 10 more steps
#
# It fails unless: A and B each end COMPLETED with exit code 0 within 30 s of
# the signal, each printing "preempted at step N: saved in X s" and rank 0's
# "step N saved for preemption" log line; each step's marker holds the
# preemption record; B and C restore exactly the previous job's preemption
# step, with the fingerprint it was saved with.
#
#   slurm/preempt.sh [BUILD_DIR=build]
#
# Environment: WORK (default /var/tmp/mhckpt-preempt; on a file system every
# node sees), MHCKPT_SLURM_BASE (default /tmp/mhckpt-pre), MHCKPT_SLURM_PORT
# (default 17500), MODEL_MIB (the demo's sharded state, all ranks together;
# default 64), KEEP_CLUSTER=1 leaves it up.
# Needs root and scripts/bootstrap.sh's packages (slurm-wlm, munge).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
demo=$build/bin/mhckpt-train-demo
WORK=${WORK:-/var/tmp/mhckpt-preempt}
MODEL_MIB=${MODEL_MIB:-64}
export MHCKPT_SLURM_BASE=${MHCKPT_SLURM_BASE:-/tmp/mhckpt-pre}
export MHCKPT_SLURM_PORT=${MHCKPT_SLURM_PORT:-17500}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# As slurm/stress.py: every "node" is this machine (loopback, yielding ranks),
# and no modex fence (Open MPI under srun --mpi=pmix crashed in MPI_Init now
# and then with it).
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_pmix_base_async_modex=1 OMPI_MCA_pmix_base_collect_data=0
root=$WORK/ckpt
logs=$WORK/logs
rm -rf "$WORK" && mkdir -p "$logs"

slurm/local-cluster.sh up 3 >/dev/null
export SLURM_CONF=$MHCKPT_SLURM_BASE/slurm.conf
[ "${KEEP_CLUSTER:-0}" = 1 ] || trap 'slurm/local-cluster.sh down >/dev/null 2>&1 || true' EXIT

fail() {
  {
    echo "FAIL: $*"
    for f in "$logs"/*.log; do
      echo "---- $f"
      tail -30 "$f"
    done
  } >&2
  exit 1
}
job_field() { # JOB FIELD: a field of `scontrol show job`, or GONE
  local line
  line=$(scontrol show job -o "$1" 2>/dev/null) || {
    echo GONE
    return
  }
  echo "$line" | grep -o "\b$2=[^ ]*" | head -1 | cut -d= -f2
}
wait_for() { # FILE REGEX SECONDS JOB: until FILE has a line matching REGEX
  local deadline=$((SECONDS + $3))
  until grep -qE "$2" "$1" 2>/dev/null; do
    case $(job_field "$4" JobState) in PENDING | RUNNING | CONFIGURING) ;; *) fail "job $4 ended before '$2' in $1" ;; esac
    [ $SECONDS -lt $deadline ] || fail "no '$2' in $1 within $3 s"
    sleep 0.5
  done
}
wait_done() { # JOB SECONDS: until the job has ended; prints its state
  local deadline=$((SECONDS + $2)) state
  while :; do
    state=$(job_field "$1" JobState)
    case $state in PENDING | RUNNING | CONFIGURING | COMPLETING) ;; *) break ;; esac
    [ $SECONDS -lt $deadline ] || fail "job $1 still $state after $2 s"
    sleep 0.2
  done
  echo "$state"
}
submit() { # NAME NODES DEMO-ARGS...: the job id
  local name=$1 nodes=$2
  shift 2
  # --signal=USR1@60: the scheduler's own notice 60 s before the time limit,
  # to the tasks (not B:, which would signal the batch shell, whom SIGUSR1
  # kills).
  sbatch --parsable -N "$nodes" --ntasks-per-node=1 --time=30 --signal=USR1@60 -J "$name" \
    -o "$logs/$name.log" -D "$WORK" --wrap "srun --mpi=pmix $demo --dir $root \
    --model-mib $MODEL_MIB --save-every 20 --log-every 5 --max-to-keep 0 --lazy --preemption \
    --grace 30 $*"
}
preempted_step() { # LOG: the step of its "preempted at step N: saved in X s" line
  local n
  n=$(grep -E '^preempted at step [0-9]+: saved in [0-9.]+ s$' "$1" | sed -E 's/^preempted at step ([0-9]+):.*/\1/')
  [ -n "$n" ] || fail "$1: no 'preempted at step N: saved in X s' line"
  grep -q "step $n saved for preemption: .* of a 30 s grace period" "$1" ||
    fail "$1: rank 0 did not log the preemption save of step $n"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])).get('preemption'); sys.exit(0 if r and r['grace_ms']==30000 else 1)" \
    "$root/step_$(printf %010d "$n")/commit.json" || fail "step $n: its marker has no preemption record"
  echo "$n"
}
check_clean_end() { # JOB NAME SIGNALLED_AT
  local state elapsed code
  state=$(wait_done "$1" 60)
  elapsed=$((SECONDS - $3))
  code=$(job_field "$1" ExitCode)
  [ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || fail "job $2: $state, exit code $code"
  [ $elapsed -le 30 ] || fail "job $2 ended $elapsed s after the signal"
  echo "job $2: COMPLETED, exit code 0:0, within $elapsed s of the signal"
}
fingerprint() { # LOG STEP: the fingerprint printed for STEP (first line)
  grep -E "^fingerprint step=$2 " "$1" | head -1 | awk '{print $3}'
}
restored_step() { # LOG
  grep -E '^restored step=' "$1" | sed -E 's/^restored step=([0-9]+) .*/\1/'
}

# A: the whole job signalled.
jid=$(submit A 2 --steps 1000000)
wait_for "$logs/A.log" '^saving step=20 ' 300 "$jid"
sleep 1
signalled=$SECONDS
scancel --signal=USR1 "$jid"
check_clean_end "$jid" A "$signalled"
a=$(preempted_step "$logs/A.log")
echo "job A: preempted at step $a ($(grep '^preempted at step' "$logs/A.log"))"

# B: one task of two signalled.
jid=$(submit B 2 --steps 1000000 --resume)
wait_for "$logs/B.log" '^restored step=' 300 "$jid"
[ "$(restored_step "$logs/B.log")" = "$a" ] || fail "job B restored step $(restored_step "$logs/B.log"), not $a"
[ "$(fingerprint "$logs/B.log" "$a")" = "$(fingerprint "$logs/A.log" "$a")" ] ||
  fail "job B restored step $a with another fingerprint"
wait_for "$logs/B.log" '^saving step=' 300 "$jid"
pid=""
for p in $(pgrep -f "mhckpt-train-demo --dir $root" || true); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx SLURM_PROCID=1; then pid=$p; fi
done
[ -n "$pid" ] || fail "no pid for task 1 of job B"
signalled=$SECONDS
kill -USR1 "$pid"
check_clean_end "$jid" B "$signalled"
b=$(preempted_step "$logs/B.log")
[ "$b" -gt "$a" ] || fail "job B preempted at step $b, not after $a"
echo "job B: task 1 (pid $pid) alone signalled; preempted at step $b"

# C: resubmitted on 3 nodes.
jid=$(submit C 3 --steps $((b + 10)) --resume)
state=$(wait_done "$jid" 300)
[ "$state" = COMPLETED ] || fail "job C: $state"
[ "$(restored_step "$logs/C.log")" = "$b" ] || fail "job C restored step $(restored_step "$logs/C.log"), not $b"
[ "$(fingerprint "$logs/C.log" "$b")" = "$(fingerprint "$logs/B.log" "$b")" ] ||
  fail "job C restored step $b with another fingerprint"
grep -q "^done: step $((b + 10)) " "$logs/C.log" || fail "job C did not train to step $((b + 10))"
echo "job C: 3 nodes resumed step $b ($(fingerprint "$logs/C.log" "$b")) and trained to $((b + 10))"
echo "preempt: ok (model $MODEL_MIB MiB over the ranks)"
