#!/usr/bin/env bash
# A real Slurm cluster of N nodes on this one machine, for tests and for trying
# the sbatch templates by hand (docs/SLURM.md):
#
#   slurm/local-cluster.sh up 3      # munged, slurmctld, slurmd n1..n3; nodes idle
#   export SLURM_CONF=/tmp/mhckpt-slurm/slurm.conf
#   sinfo; srun -N 3 hostname; sbatch -N 2 slurm/train.sbatch
#   slurm/local-cluster.sh status
#   slurm/local-cluster.sh down
#
# What "up N" starts, each in the background with its output in BASE/log/:
#   - munged, as user munge, with its own key (BASE/munge/munge.key, made if
#     missing, mode 0400) and socket (BASE/munge/munge.socket.2);
#   - slurmctld, in its own UTS namespace (hostname "ctl"), listening on
#     127.0.0.1:PORT;
#   - slurmd n1..nN (slurmd -N nK), each in its own UTS namespace whose
#     hostname is nK, so that the tasks of a job see one host per node (Open
#     MPI's shared-memory transport crashes when "different nodes" share a
#     hostname), listening on 127.0.0.1:PORT+K;
#   - and in its own mount namespace, with node-local storage: a tmpfs of its
#     own mounted at LOCAL (BASE/local by default), which only that node's
#     processes (its slurmd, and the job steps and tasks it starts) see. The
#     same path names a different tmpfs on every node, as a node-local disk
#     or /dev/shm does on a real cluster (for Options::local_dir). From
#     outside, node nK's is /proc/<its slurmd's pid>/root/LOCAL.
#
#   slurm/local-cluster.sh wipe n2   # node n2's local storage is lost: its
#                                    # tmpfs is replaced by an empty one
#                                    # (a node that died and came back, or
#                                    # its replacement)
# Nothing but 127.0.0.1 is used. Job state and node spools are wiped at every
# bring-up (stale PMIx sockets from an earlier cluster break srun --mpi=pmix).
# "up" is idempotent: a cluster already up with N healthy nodes is left alone;
# one of another size is taken down first. "down" cancels the cluster's jobs
# and stops exactly the processes "up" started (by the PIDs it recorded).
#
# Environment:
#   MHCKPT_SLURM_BASE   base directory (default /tmp/mhckpt-slurm). Keep it
#                       short: Unix socket paths under it must fit 107 bytes.
#   MHCKPT_SLURM_PORT   slurmctld's port; node K listens on PORT+K (default 17000)
#   MHCKPT_SLURM_CPUS   CPUs each node advertises (default 2)
#   MHCKPT_SLURM_TIMEOUT  seconds to wait for each daemon to come up (default 30)
#   MHCKPT_SLURM_LOCAL  where each node mounts its own tmpfs (default BASE/local)
#   MHCKPT_SLURM_LOCAL_MIB  the size of each node's tmpfs (default 1024; tmpfs
#                       takes memory only for what is written)
# Needs root (munged runs as user munge; slurmd runs jobs as their user) and
# the Debian packages slurm-wlm and munge (scripts/bootstrap.sh installs them).
set -euo pipefail

BASE=${MHCKPT_SLURM_BASE:-/tmp/mhckpt-slurm}
PORT=${MHCKPT_SLURM_PORT:-17000}
CPUS=${MHCKPT_SLURM_CPUS:-2}
TIMEOUT=${MHCKPT_SLURM_TIMEOUT:-30}
LOCAL=${MHCKPT_SLURM_LOCAL:-$BASE/local}
LOCAL_MIB=${MHCKPT_SLURM_LOCAL_MIB:-1024}
CONF=$BASE/slurm.conf
PIDS=$BASE/pids
# Every daemon started here carries this marker in its environment (and so do
# the slurmstepd processes its slurmd forks), so that "down" can find
# leftovers of this cluster and nothing else.
OWNER="MHCKPT_SLURM_OWNER=$BASE"

log() { echo "local-cluster: $*"; }
die() {
  echo "local-cluster: ERROR: $*" >&2
  exit 1
}

usage() {
  cat >&2 <<EOF
usage: $0 up N | down | status | wipe NODE
  up N       start (or keep) a cluster of N slurmd nodes n1..nN on this machine
  down       cancel its jobs, stop the daemons it started
  status     its daemons and sinfo
  wipe NODE  replace node NODE's local storage ($LOCAL) by an empty tmpfs
base directory: $BASE (MHCKPT_SLURM_BASE), ports $PORT.. (MHCKPT_SLURM_PORT)
EOF
  exit 2
}

# ---- helpers ---------------------------------------------------------------

# True if process $1 exists and is not a zombie (nothing may reap daemons
# whose parent exited).
pid_running() {
  [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
  local state
  state=$(sed 's/^.*) \(.\).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [ "$state" != Z ] && [ "$state" != X ]
}

# True if $1 is a live process of this cluster: running, and it carries the
# marker in its environment (a recycled PID does not).
pid_alive() {
  pid_running "${1:-}" && grep -qzxF "$OWNER" "/proc/$1/environ" 2>/dev/null
}

recorded_pid() { cat "$PIDS/$1.pid" 2>/dev/null || true; }

# Waits up to $1 seconds for the command "$3 ..." to succeed, and gives up at
# once if the daemon whose PID file is $PIDS/$2.pid died ("" for none). The
# daemon was started moments ago, so its PID is not yet reused; and until
# `env` has exec'd the next program, /proc/PID/environ does not show OWNER
# yet: only "still running" is checked here.
wait_for() {
  local limit=$1 daemon=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ -n "$daemon" ] && ! pid_running "$(recorded_pid "$daemon")"; then
      echo "local-cluster: $daemon exited" >&2
      return 1
    fi
    [ $((SECONDS - t0)) -lt "$limit" ] || return 1
    sleep 0.2
  done
}

# Runs a Slurm client command against this cluster, bounded in time.
sl() { SLURM_CONF=$CONF timeout 15 "$@"; }

recorded_nodes() { cat "$BASE/nodes" 2>/dev/null || echo 0; }

# Starts "$2 ..." in the background, detached (own session, stdio to the log
# file $1), records its PID as $PIDS/<name>.pid. The command must exec the
# daemon in the foreground so that the PID is the daemon's.
start_daemon() {
  local name=$1 logfile=$2
  shift 2
  env "$OWNER" setsid "$@" </dev/null >>"$logfile" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

tail_log() {
  [ -f "$1" ] || return 0
  echo "---- last lines of $1:" >&2
  tail -n 15 "$1" >&2
}

check_tools() {
  local missing=()
  for t in munged slurmctld slurmd sinfo scontrol srun unshare nsenter setsid runuser mountpoint; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing ${missing[*]}: install the Debian packages slurm-wlm munge (scripts/bootstrap.sh)"
  [ "$(id -u)" -eq 0 ] || die "run as root (munged runs as user munge, slurmd as root)"
  id munge >/dev/null 2>&1 || die "no user 'munge' (install the Debian package munge)"
  case "$BASE" in
    /*) ;;
    *) die "MHCKPT_SLURM_BASE must be an absolute path, not '$BASE'" ;;
  esac
  [ "$BASE" != / ] || die "MHCKPT_SLURM_BASE must not be /"
  # The longest socket: munge's (PMIx's live under BASE/tmp/nK and are longer
  # still, by about 40 bytes).
  [ ${#BASE} -le 60 ] || die "MHCKPT_SLURM_BASE '$BASE' is too long for Unix socket paths (max 60 characters)"
}

# True if the cluster recorded in BASE is up with $1 nodes, every daemon alive
# and every node idle, allocated or mixed.
healthy() {
  local n=$1
  [ "$(recorded_nodes)" = "$n" ] || return 1
  pid_alive "$(recorded_pid munged)" && pid_alive "$(recorded_pid slurmctld)" || return 1
  local k
  for ((k = 1; k <= n; k++)); do
    pid_alive "$(recorded_pid "slurmd-n$k")" || return 1
    has_local_tmpfs "$(recorded_pid "slurmd-n$k")" || return 1
  done
  local states
  states=$(sl sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(echo "$states" | grep -cE ' (idle|allocated|mixed|completing)$')" -eq "$n" ]
}

# True if the process $1 sees a tmpfs of its own at LOCAL (its node's).
has_local_tmpfs() {
  [ "$(nsenter -t "$1" -m stat -f -c %T "$LOCAL" 2>/dev/null)" = tmpfs ] &&
    [ "$(readlink "/proc/$1/ns/mnt")" != "$(readlink /proc/$$/ns/mnt)" ]
}

all_idle() {
  local n=$1 states
  states=$(sl sinfo -h -N -o '%N %T' 2>/dev/null) || return 1
  [ "$(echo "$states" | grep -c ' idle$')" -eq "$n" ]
}

# Prints the slurm.conf of a cluster of $1 nodes.
conf_text() {
  local n=$1
  cat <<EOF
# Generated by slurm/local-cluster.sh: $n nodes on this machine, loopback only.
ClusterName=mhckpt
SlurmctldHost=ctl(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/munge.socket.2
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
TmpFS=$BASE/tmp/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The nodes advertise more CPUs than the machine may have.
SlurmdParameters=config_overrides
MpiDefault=pmix
# A node set DOWN by scontrol stays down until "scontrol update NodeName=nK
# State=RESUME" (with 2, it would come back as soon as its slurmd answers).
ReturnToService=1
SlurmdTimeout=60
SlurmctldTimeout=60
KillWait=5
MinJobAge=30
InactiveLimit=0
NodeName=n[1-$n] NodeAddr=127.0.0.1 Port=$((PORT + 1))-$((PORT + n)) CPUs=$CPUS RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

print_usage_hint() {
  cat <<EOF
local-cluster: up: $(recorded_nodes) nodes (n1..n$(recorded_nodes)) on 127.0.0.1, base $BASE
To use it:
  export SLURM_CONF=$CONF
  export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo   # MPI over loopback only
  export OMPI_MCA_pmix_base_async_modex=1 OMPI_MCA_pmix_base_collect_data=0  # see docs/SLURM.md
  sinfo
  srun -N $(recorded_nodes) --mpi=pmix hostname
  sbatch -N 2 slurm/train.sbatch
  scontrol update NodeName=n2 State=DOWN Reason=test    # fail a node
  scontrol update NodeName=n2 State=RESUME              # and bring it back
Logs: $BASE/log/   Take it down: $0 down
EOF
}

# ---- down ------------------------------------------------------------------

# Processes whose environment carries this cluster's marker, or that live in
# one of the UTS namespaces $@ (a node's: its slurmstepd and job tasks, whose
# environment does not carry the marker).
owned_pids() {
  local p ns
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" != $$ ] || continue
    if grep -qzxF "$OWNER" "$p/environ" 2>/dev/null; then
      echo "${p#/proc/}"
      continue
    fi
    [ $# -gt 0 ] || continue
    ns=$(readlink "$p/ns/uts" 2>/dev/null) || continue
    if [[ " $* " == *" $ns "* ]]; then echo "${p#/proc/}"; fi
  done
  return 0
}

do_down() {
  [ -d "$PIDS" ] || {
    log "down: nothing recorded under $BASE"
    return 0
  }
  # Jobs first, while slurmctld can still end them on their nodes.
  if pid_alive "$(recorded_pid slurmctld)"; then
    sl scancel --full --quiet --user=root 2>/dev/null || true
    local t0=$SECONDS
    while [ -n "$(sl squeue -h -o %i 2>/dev/null)" ] && [ $((SECONDS - t0)) -lt 10 ]; do
      sleep 0.3
    done
  fi
  # The nodes' own UTS namespaces (never this shell's), for the sweep below.
  local node_ns=() f ns host_ns
  host_ns=$(readlink /proc/$$/ns/uts)
  for f in "$PIDS"/slurmd-*.pid "$PIDS/slurmctld.pid"; do
    [ -f "$f" ] && pid_alive "$(cat "$f")" || continue
    ns=$(readlink "/proc/$(cat "$f")/ns/uts" 2>/dev/null) || continue
    [ "$ns" = "$host_ns" ] || node_ns+=("$ns")
  done
  # Node daemons, then the controller, then munged; each group SIGTERM'd at
  # once, SIGKILL'd after 5 s.
  local group pid t0
  for group in slurmd slurmctld munged; do
    local pids=()
    for f in "$PIDS/$group"*.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      if pid_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
      fi
      rm -f "$f"
    done
    t0=$SECONDS
    for pid in "${pids[@]}"; do
      while pid_alive "$pid" && [ $((SECONDS - t0)) -lt 5 ]; do sleep 0.1; done
      if pid_alive "$pid"; then
        log "down: $group ($pid) ignored SIGTERM; SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
    done
  done
  # Leftovers of this cluster (slurmstepd of a job that did not end).
  local left
  left=$(owned_pids "${node_ns[@]}" | tr '\n' ' ')
  if [ -n "${left// /}" ]; then
    log "down: SIGKILL to leftover processes of this cluster: $left"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
  fi
  echo 0 >"$BASE/nodes"
  log "down: stopped (base $BASE)"
}

# A failed bring-up: stop what did start, then fail with the message.
fail_up() {
  echo "local-cluster: bring-up failed: $*" >&2
  do_down >&2 || true
  die "$*"
}

# ---- up --------------------------------------------------------------------

start_munged() {
  local m=$BASE/munge
  mkdir -p "$m"
  if [ ! -s "$m/munge.key" ]; then
    log "generating a munge key in $m/munge.key"
    if command -v mungekey >/dev/null; then
      rm -f "$m/munge.key"
      mungekey --create --keyfile="$m/munge.key" >/dev/null
    else
      dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
    fi
  fi
  chown -R munge:munge "$m"
  chmod 0755 "$m"
  chmod 0400 "$m/munge.key"
  rm -f "$m/munge.socket.2" "$m/munge.socket.2.lock" "$m/munged.pid"
  start_daemon munged "$BASE/log/munged.out" runuser -u munge -- munged --foreground \
    --socket="$m/munge.socket.2" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
    --log-file="$m/munged.log" --seed-file="$m/munged.seed"
  if ! wait_for "$TIMEOUT" munged test -S "$m/munge.socket.2"; then
    tail_log "$BASE/log/munged.out"
    tail_log "$m/munged.log"
    return 1
  fi
  # runuser forks munged as its child: record munged's own PID.
  local pid
  pid=$(cat "$m/munged.pid" 2>/dev/null || true)
  if pid_alive "$pid"; then
    # Keep both: runuser waits for munged; stopping munged ends it.
    echo "$pid" >"$PIDS/munged.pid"
  fi
}

do_up() {
  local n=$1
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 64 ] || die "up: N must be 1..64, not '$n'"
  check_tools
  mkdir -p "$BASE"
  if healthy "$n" && [ "$(conf_text "$n")" = "$(cat "$CONF" 2>/dev/null)" ]; then
    log "already up with $n nodes"
    print_usage_hint
    return 0
  fi
  [ "$(recorded_nodes)" = 0 ] || log "restarting (recorded: $(recorded_nodes) nodes, wanted $n)"
  do_down >/dev/null
  # A fresh state: no jobs, no node spools, no stale PMIx sockets.
  rm -rf "${BASE:?}/state" "${BASE:?}/spool" "${BASE:?}/tmp" "${BASE:?}/run" "${BASE:?}/log" "$PIDS"
  mkdir -p "$BASE/state" "$BASE/run" "$BASE/log" "$PIDS"
  chmod 0755 "$BASE"
  local k
  for ((k = 1; k <= n; k++)); do mkdir -p "$BASE/spool/n$k" "$BASE/tmp/n$k"; done
  conf_text "$n" >"$CONF"
  echo "export SLURM_CONF=$CONF" >"$BASE/env"
  echo "$n" >"$BASE/nodes"
  start_munged || fail_up "munged did not create its socket within ${TIMEOUT} s (logs above)"

  start_daemon slurmctld "$BASE/log/slurmctld.out" unshare --uts \
    sh -c 'hostname ctl && exec slurmctld -D -i -f "$1"' sh "$CONF"
  if ! wait_for "$TIMEOUT" slurmctld sl scontrol ping; then
    tail_log "$BASE/log/slurmctld.out"
    fail_up "slurmctld did not answer 'scontrol ping' within ${TIMEOUT} s (its log is above; $BASE/log/)"
  fi

  # LOCAL exists outside too (empty): each node mounts its tmpfs over it.
  mkdir -p "$LOCAL"
  for ((k = 1; k <= n; k++)); do
    start_daemon "slurmd-n$k" "$BASE/log/slurmd-n$k.out" unshare --uts --mount --propagation private \
      sh -c 'hostname "$1" && mount -t tmpfs -o "size=$4m,mode=0755" "mhckpt-local-$1" "$3" &&
             exec slurmd -D -f "$2" -N "$1"' sh "n$k" "$CONF" "$LOCAL" "$LOCAL_MIB"
  done
  if ! wait_for "$TIMEOUT" slurmctld all_idle "$n"; then
    sl sinfo -N >&2 || true
    for ((k = 1; k <= n; k++)); do
      pid_alive "$(recorded_pid "slurmd-n$k")" || echo "slurmd n$k is not running" >&2
    done
    tail_log "$BASE/log/slurmd-n1.out"
    tail_log "$BASE/log/slurmd-n1.log"
    tail_log "$BASE/log/slurmctld.log"
    fail_up "the $n nodes were not all idle within ${TIMEOUT} s (logs above; $BASE/log/)"
  fi
  print_usage_hint
}

# ---- wipe ------------------------------------------------------------------

# Node $1 loses its local storage: its tmpfs at LOCAL is unmounted (lazily:
# a process of the node may still hold a file open) and an empty one mounted,
# inside the node's mount namespace.
do_wipe() {
  local node=$1 pid
  pid=$(recorded_pid "slurmd-$node")
  pid_alive "$pid" || die "wipe: node '$node' has no running slurmd (recorded: $(recorded_nodes) nodes)"
  has_local_tmpfs "$pid" || die "wipe: node $node has no tmpfs of its own at $LOCAL"
  nsenter -t "$pid" -m sh -c 'umount -l "$1" && mount -t tmpfs -o "size=$2m,mode=0755" "mhckpt-local-$3" "$1"' \
    sh "$LOCAL" "$LOCAL_MIB" "$node" || die "wipe: remounting $LOCAL on $node failed"
  has_local_tmpfs "$pid" || die "wipe: node $node has no tmpfs at $LOCAL after the wipe"
  log "wipe: $node's local storage $LOCAL is a new, empty tmpfs"
}

# ---- status ----------------------------------------------------------------

do_status() {
  local n rc=0 k
  n=$(recorded_nodes)
  echo "base $BASE, recorded nodes: $n"
  for name in munged slurmctld $(for ((k = 1; k <= n; k++)); do echo "slurmd-n$k"; done); do
    local pid
    pid=$(recorded_pid "$name")
    if pid_alive "$pid"; then
      echo "  $name: running (pid $pid)"
      if [[ $name == slurmd-* ]]; then
        echo "    local storage $LOCAL: $(nsenter -t "$pid" -m df -h --output=fstype,used,size "$LOCAL" 2>/dev/null | tail -n 1)"
      fi
    else
      echo "  $name: NOT running"
      rc=1
    fi
  done
  if [ "$n" != 0 ] && pid_alive "$(recorded_pid slurmctld)"; then
    echo "export SLURM_CONF=$CONF"
    sl sinfo -N -o '%N %T %E' || rc=1
    sl squeue || true
  fi
  return $rc
}

case "${1:-}" in
  up)
    [ $# -eq 2 ] || usage
    do_up "$2"
    ;;
  down)
    [ $# -eq 1 ] || usage
    do_down
    ;;
  status)
    [ $# -eq 1 ] || usage
    do_status
    ;;
  wipe)
    [ $# -eq 2 ] || usage
    do_wipe "$2"
    ;;
  *) usage ;;
esac
