#!/usr/bin/env bash
#SBATCH --job-name=mhckpt-relaunch
#SBATCH --no-kill
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --time=04:00:00
#SBATCH --output=mhckpt-relaunch-%j.out
#
# Runs an MPI program inside a Slurm allocation and, when a launch fails,
# launches it again from the latest committed mhckpt checkpoint on the nodes
# of the allocation that are still up — fewer nodes if one failed — up to K
# launches in all (compare SCR's scr_srun_loop). mhckpt restores on any number
# of ranks, so the program only needs to take a "resume" flag.
#
#   sbatch --no-kill -N 4 slurm/relaunch-loop.sh --attempts 3 --ckpt-dir /lustre/run1 \
#          -- ./train --ckpt /lustre/run1
#   salloc --no-kill -N 4  then  slurm/relaunch-loop.sh ... -- ./train ...
#   MHCKPT_ATTEMPTS=3 sbatch --no-kill -N 4 slurm/train.sbatch   (the same, set up by train.sbatch)
#
# --no-kill matters: without it a node failure revokes the whole allocation,
# this script included. With it, Slurm ends only the running step (srun exits
# non-zero: "Node failure on n3"), drops the failed node from the job, and this
# loop goes on. The node running this script (the allocation's first) must
# survive; a failure there ends the job like any other.
#
# Each launch:
#   1. nodes: the job's current node list (scontrol show job; Slurm removes a
#      failed node from a --no-kill job) minus any node sinfo reports down,
#      drained, failing or not responding; the first --nodes of them (default:
#      all). Fewer than --min-nodes: give up.
#   2. resume: if --ckpt-dir holds a committed step, --resume-args (default
#      --resume) are appended to the program's arguments.
#   3. srun --mpi=pmix --kill-on-bad-exit=1 -N <nodes> -n <nodes * tasks per
#      node> --nodelist=<nodes> PROGRAM ARGS [RESUME ARGS]
#      (or, with --launcher mpirun, Open MPI's mpirun --host <node:T,...> -np
#      <nodes * T> inside the allocation: its daemons start through srun
#      without the PMIx plugin; --launcher auto uses mpirun only when the nodes
#      leave a gap in the allocation's node order, n1,n3 of n1-n3, which the
#      PMIx plugin of Slurm 22.05 cannot wire up on the local cluster of
#      slurm/local-cluster.sh, docs/SLURM.md)
#   4. exit status 0: done. Otherwise wait --delay seconds and go again —
#      unless two launches in a row lost no node and committed no new step (a
#      bug or a bad input, which a relaunch repeats; one such launch may be a
#      transient crash and is retried): then stop, unless --retry-any.
# Every decision is one line starting with "relaunch-loop:" (parsed by
# slurm/stress.py).
#
# Options (and the environment variables that set their defaults):
#   --attempts K          launches in all (MHCKPT_ATTEMPTS, default 3)
#   --ckpt-dir DIR        checkpoint root to look for committed steps in
#                         (MHCKPT_CKPT_DIR; without it, never resume)
#   --resume-args "ARGS"  added when resuming (MHCKPT_RESUME_ARGS, "--resume")
#   --nodes N             at most N nodes per launch (MHCKPT_NODES; all)
#   --min-nodes M         fewer healthy nodes than M: stop (MHCKPT_MIN_NODES, 1)
#   --tasks-per-node T    (MHCKPT_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, else 1)
#   --srun-args "ARGS"    more srun arguments (MHCKPT_SRUN_ARGS)
#   --launcher L          srun, mpirun or auto (MHCKPT_LAUNCHER, default srun)
#   --mpirun-args "ARGS"  more mpirun arguments (MHCKPT_MPIRUN_ARGS)
#   --delay S             seconds between launches (MHCKPT_RELAUNCH_DELAY, 3)
#   --retry-any           relaunch after any failure (MHCKPT_RETRY_ANY=1)
#   --mhckpt PATH         the mhckpt CLI, to find the latest committed step
#                         (MHCKPT_CLI; default: build/bin/mhckpt under
#                         SLURM_SUBMIT_DIR, else commit.json files are looked for)
set -uo pipefail

ATTEMPTS=${MHCKPT_ATTEMPTS:-3}
CKPT_DIR=${MHCKPT_CKPT_DIR:-}
RESUME_ARGS=${MHCKPT_RESUME_ARGS---resume}
MAX_NODES=${MHCKPT_NODES:-0}
MIN_NODES=${MHCKPT_MIN_NODES:-1}
TPN=${MHCKPT_TASKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-1}}
SRUN_ARGS=${MHCKPT_SRUN_ARGS:-}
LAUNCHER=${MHCKPT_LAUNCHER:-srun}
MPIRUN_ARGS=${MHCKPT_MPIRUN_ARGS:-}
DELAY=${MHCKPT_RELAUNCH_DELAY:-3}
CLI=${MHCKPT_CLI:-${SLURM_SUBMIT_DIR:-.}/build/bin/mhckpt}
RETRY_ANY=${MHCKPT_RETRY_ANY:-0}

say() { echo "relaunch-loop: $*"; }
die() {
  echo "relaunch-loop: ERROR: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --attempts) ATTEMPTS=$2; shift 2 ;;
    --ckpt-dir) CKPT_DIR=$2; shift 2 ;;
    --resume-args) RESUME_ARGS=$2; shift 2 ;;
    --nodes) MAX_NODES=$2; shift 2 ;;
    --min-nodes) MIN_NODES=$2; shift 2 ;;
    --tasks-per-node) TPN=$2; shift 2 ;;
    --srun-args) SRUN_ARGS=$2; shift 2 ;;
    --launcher) LAUNCHER=$2; shift 2 ;;
    --mpirun-args) MPIRUN_ARGS=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --mhckpt) CLI=$2; shift 2 ;;
    --retry-any) RETRY_ANY=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//;/^set -uo/d;/^SBATCH/d'; exit 0 ;;
    *) die "unknown option '$1' (the program goes after --)" ;;
  esac
done
[ $# -gt 0 ] || die "no program: relaunch-loop.sh [options] -- PROGRAM [ARGS...]"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm allocation (run it under sbatch --no-kill or salloc --no-kill)"
for v in ATTEMPTS MIN_NODES TPN MAX_NODES; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a number, not '${!v}'"
done
[ "$TPN" -ge 1 ] || TPN=1
case "$LAUNCHER" in srun | mpirun | auto) ;; *) die "--launcher must be srun, mpirun or auto, not '$LAUNCHER'" ;; esac
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# The nodes of this job that are up, in the job's order, one per line.
healthy_nodes() {
  local list states
  list=$(timeout 30 scontrol show job -o "$SLURM_JOB_ID" | tr ' ' '\n' | sed -n 's/^NodeList=//p')
  [ -n "$list" ] && [ "$list" != "(null)" ] || return 0
  # "%n %t": node name, compact state; down*, drain, fail, no-respond (*) are out.
  states=$(timeout 30 sinfo -h -N -n "$list" -o '%n %t' | sort -u)
  timeout 30 scontrol show hostnames "$list" | while read -r node; do
    state=$(echo "$states" | awk -v n="$node" '$1 == n { print $2; exit }')
    case "$state" in
      "" | *down* | *drain* | *drng* | *fail* | *'*'* | *maint* | *unk*) ;;
      *) echo "$node" ;;
    esac
  done
}

# Succeeds if the nodes given (in the job's order) are consecutive in the
# allocation's original node list.
gap_free() {
  local all i first=-1 k=0
  mapfile -t all < <(timeout 30 scontrol show hostnames "$SLURM_JOB_NODELIST")
  for ((i = 0; i < ${#all[@]}; i++)); do
    [ "${all[$i]}" = "$1" ] && first=$i
  done
  [ "$first" -ge 0 ] || return 1
  for node in "$@"; do
    [ "${all[$((first + k))]:-}" = "$node" ] || return 1
    k=$((k + 1))
  done
}

# The newest committed step under CKPT_DIR, or nothing.
latest_committed() {
  [ -n "$CKPT_DIR" ] && [ -d "$CKPT_DIR" ] || return 0
  if [ -x "$CLI" ]; then
    timeout 120 "$CLI" list "$CKPT_DIR" --json 2>/dev/null | python3 -c '
import json, sys
steps = [s["step"] for s in json.load(sys.stdin)["steps"] if s["committed"]]
print(max(steps) if steps else "")' 2>/dev/null
  else
    find "$CKPT_DIR" -maxdepth 2 -path '*/step_*/commit.json' 2>/dev/null |
      sed 's|.*/step_0*\([0-9][0-9]*\)/commit.json|\1|' | sort -n | tail -n 1
  fi
}

say "job $SLURM_JOB_ID: up to $ATTEMPTS launches of: $*"
rc=1
futile=0   # launches in a row that lost no node and committed nothing
for ((attempt = 1; attempt <= ATTEMPTS; attempt++)); do
  mapfile -t nodes < <(healthy_nodes)
  if [ "$MAX_NODES" -gt 0 ] && [ ${#nodes[@]} -gt "$MAX_NODES" ]; then
    nodes=("${nodes[@]:0:$MAX_NODES}")
  fi
  n=${#nodes[@]}
  if [ "$n" -lt "$MIN_NODES" ] || [ "$n" -eq 0 ]; then
    say "attempt $attempt/$ATTEMPTS: only $n healthy node(s) left (need $MIN_NODES): giving up"
    exit 3
  fi
  nodelist=$(IFS=,; echo "${nodes[*]}")
  extra=()
  latest=$(latest_committed)
  if [ -n "$latest" ]; then
    # shellcheck disable=SC2206
    extra=($RESUME_ARGS)
    from="resume from step $latest"
  else
    from="fresh start"
  fi
  launcher=$LAUNCHER
  if [ "$launcher" = auto ]; then
    launcher=srun
    gap_free "${nodes[@]}" || launcher=mpirun
  fi
  say "attempt $attempt/$ATTEMPTS: $n nodes ($nodelist), $((n * TPN)) tasks, $from, $launcher"
  t0=$SECONDS
  if [ "$launcher" = srun ]; then
    # The allocation's own counts would contradict -N after a node was dropped.
    # shellcheck disable=SC2086
    SLURM_JOB_NUM_NODES=$n SLURM_NNODES=$n srun --mpi=pmix --kill-on-bad-exit=1 \
      -N "$n" -n $((n * TPN)) --ntasks-per-node="$TPN" --nodelist="$nodelist" \
      $SRUN_ARGS "$@" "${extra[@]}"
  else
    hosts=$(printf "%s:$TPN," "${nodes[@]}")
    # shellcheck disable=SC2086
    mpirun --host "${hosts%,}" -np $((n * TPN)) $MPIRUN_ARGS "$@" "${extra[@]}"
  fi
  rc=$?
  if [ "$rc" -eq 0 ]; then
    say "attempt $attempt/$ATTEMPTS: succeeded in $((SECONDS - t0)) s"
    say "done after $attempt launch(es)"
    exit 0
  fi
  say "attempt $attempt/$ATTEMPTS: failed with status $rc after $((SECONDS - t0)) s"
  [ "$attempt" -lt "$ATTEMPTS" ] || break
  sleep "$DELAY"
  if [ "$RETRY_ANY" != 1 ]; then
    mapfile -t now < <(healthy_nodes)
    lost=0
    for node in "${nodes[@]}"; do
      [[ " ${now[*]} " == *" $node "* ]] || lost=$((lost + 1))
    done
    if [ "$lost" -eq 0 ] && [ "$(latest_committed)" = "$latest" ]; then
      futile=$((futile + 1))
      if [ "$futile" -ge 2 ]; then
        say "attempt $attempt/$ATTEMPTS: twice in a row no node lost and no new committed step: not relaunching (--retry-any would)"
        exit "$rc"
      fi
    else
      futile=0
    fi
  fi
done
say "giving up after $ATTEMPTS launches (last status $rc)"
exit "$rc"
