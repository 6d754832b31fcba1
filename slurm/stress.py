#!/usr/bin/python3
"""Node failures during checkpoint writes, on a real (local) Slurm cluster.

Each round runs mhckpt-train-demo (sharded weights and Adam state, an
asynchronous save every --save-every steps) as a Slurm job on N nodes (one rank
per node), fails one of its nodes while a save is being written, and has the
job relaunched on M != N nodes, where it must resume from the latest committed
step. A round is written KIND:N>M[>...] (several failures in one round):

  loop:3>2     sbatch --no-kill -N 3 slurm/relaunch-loop.sh -- demo ...: the
               loop notices the failed launch and relaunches by itself on the
               2 nodes still up (M = N - 1 each time; the loop is under test).
  sbatch:2>3   sbatch -N 2 slurm/train.sbatch; the node failure ends the job
               (NODE_FAIL); then sbatch -N 3 slurm/train.sbatch, which resumes
               because a committed step exists.
  pair:3>3     (with --local) as sbatch, but two nodes fail at once: two
               neighbours of the local tier's ring, which hold both copies of
               one rank's boxes.

--local: the demo saves with the local tier (--local-dir on each node's own
tmpfs, slurm/local-cluster.sh; --persistent-every P). A failed node also loses
its local storage (local-cluster.sh wipe: a node that comes back, or its
replacement, starts empty), and a relaunch may use as many nodes as the failed
launch (sbatch:3>3: the failed node resumed empty, a replacement). After a
failed launch ended, the harness lists what every node's tmpfs holds
(/proc/<slurmd>/root/...); the relaunch must restore the newest step that
survived: the newest of the shared root's committed steps and of the local
steps whose every writer file lies on a node of the relaunch that holds the
step's marker (the newest 2 such; of a step saved twice, the newest save), from the tier that
rule names. Its restore fingerprint must equal the one the demo printed when
it saved that step ("saving step=S fingerprint F": a step committed only in
the local tier may never get its "committed" line).

A node failure, as a real one looks to Slurm and to the other ranks: SIGKILL of
the demo's rank on that node (found through the node's UTS namespace), then
`scontrol update NodeName=nK State=DOWN Reason=stress`. The node is resumed
(State=RESUME) at the start of the next round.

Checks, for every round:
  - each relaunch restores the newest step committed when the failed launch
    ended, and its restore fingerprint equals the one printed when that step
    committed (and the one numpy computes from its data.h5);
  - `mhckpt verify ROOT --all` passes, and the fingerprint of every committed
    step's data.h5 equals the one printed at its commit (a "broken commit"
    otherwise: a step that counts as committed but is not what was saved);
  - the last launch trains to the end.
Prints the counts (saves, failures injected, restores verified, broken
commits) and exits non-zero unless every check passed.

  slurm/stress.py --up 3 --rounds loop:3>2 --work /tmp/mhckpt-stress   # brings the cluster up and down
  slurm/stress.py --rounds 'loop:4>3>2,sbatch:2>3' ...                  # on a cluster already up
  slurm/stress.py --up 3 --local --rounds 'loop:3>2,sbatch:3>3,pair:2>2' ...
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
from fingerprint import file_fingerprint  # noqa: E402  (demo/fingerprint.py)

HERE = os.path.dirname(os.path.abspath(__file__))
FINGERPRINT = re.compile(r"^fingerprint step=(\d+) ([0-9a-f]{16})$", re.M)
COMMITTED = re.compile(r"^committed step=(\d+):", re.M)
COMMITTED_LOCAL_ONLY = re.compile(r"^committed step=(\d+):.*; in the local tier only$", re.M)
SAVING = re.compile(r"^saving step=(\d+) fingerprint ([0-9a-f]{16})$", re.M)
RESTORED = re.compile(r"^restored step=(\d+) from .* at (\d+) ranks?:", re.M)
RESTORED_TIER = re.compile(r"^restored step=\d+ from .*\((local tier|shared root)\) at \d+ ranks?:", re.M)
SBATCH_NODES = re.compile(r"^train\.sbatch: job \S+ on \d+ nodes \(([^)]*)\)", re.M)
MODEL = re.compile(r"^model: .*; (\d+) ranks?,", re.M)
DONE = re.compile(r"^done: step (\d+)", re.M)
LOOP_ATTEMPT = re.compile(r"^relaunch-loop: attempt (\d+)/\d+: (\d+) nodes \(([^)]*)\)", re.M)
TERMINAL = {"COMPLETED", "FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT", "BOOT_FAIL",
            "OUT_OF_MEMORY", "DEADLINE", "PREEMPTED"}


class StressError(Exception):
    pass


def log(msg):
    print("stress: " + msg, flush=True)


def check(cond, what):
    if not cond:
        raise StressError(what)


# ---- the demo's fingerprint, from data.h5 alone (demo/fingerprint.h) ----


# ---- Slurm and the local cluster ----

class Cluster:
    def __init__(self, args):
        self.args = args
        self.base = os.environ.get("MHCKPT_SLURM_BASE", "/tmp/mhckpt-slurm")
        self.env = dict(os.environ)
        self.env["SLURM_CONF"] = os.path.join(self.base, "slurm.conf")
        # One rank per node here, but oversubscribed cores: ranks waiting in
        # MPI yield instead of spinning.
        self.env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        self.env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        # Every "node" is this machine: MPI's TCP traffic stays on loopback.
        self.env.setdefault("OMPI_MCA_btl_tcp_if_include", "lo")
        self.env.setdefault("OMPI_MCA_oob_tcp_if_include", "lo")
        # Open MPI 4.1.4 under srun --mpi=pmix here: about 1 launch in 10-20
        # died in MPI_Init (SIGSEGV: an ob1 match fragment handled before its
        # callback was set, a plain MPI program too). Without the modex fence
        # (data fetched on demand) 0 of 190 launches did.
        self.env.setdefault("OMPI_MCA_pmix_base_async_modex", "1")
        self.env.setdefault("OMPI_MCA_pmix_base_collect_data", "0")
        self.env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        self.env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        self.jobs = set()
        # Each node's own tmpfs, at this path inside its mount namespace.
        self.local = os.environ.get("MHCKPT_SLURM_LOCAL", os.path.join(self.base, "local"))

    def slurmd_pid(self, node):
        with open(os.path.join(self.base, "pids", "slurmd-%s.pid" % node)) as f:
            return f.read().strip()

    def node_local(self, node):
        """Node `node`'s local storage, as seen from here."""
        return "/proc/%s/root%s" % (self.slurmd_pid(node), self.local)

    def run(self, *cmd, timeout=30, check_rc=True):
        try:
            p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StressError("timed out after %d s: %s" % (timeout, " ".join(cmd)))
        if check_rc and p.returncode != 0:
            raise StressError("%s -> %d: %s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        return p

    def local_cluster(self, *what, timeout=120):
        cmd = [os.path.join(HERE, "local-cluster.sh")] + list(what)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StressError("'%s' did not finish within %d s" % (" ".join(cmd), timeout))
        sys.stdout.write(p.stdout)
        sys.stdout.write(p.stderr)
        if p.returncode != 0:
            raise StressError("'%s' failed (status %d): see its messages above"
                              % (" ".join(cmd), p.returncode))

    def node_states(self):
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def all_nodes(self):
        return sorted(self.node_states(), key=lambda n: int(re.sub(r"\D", "", n) or 0))

    def restore_nodes(self, timeout=30):
        """RESUMEs every node down or drained, waits for all to be idle."""
        states = self.node_states()
        for node, state in states.items():
            if state.startswith(("down", "drain", "fail")):
                self.run("scontrol", "update", "NodeName=" + node, "State=RESUME")
        deadline = time.time() + timeout
        while time.time() < deadline:
            states = self.node_states()
            if all(s == "idle" for s in states.values()):
                return len(states)
            time.sleep(0.3)
        raise StressError("nodes not all idle %d s after RESUME: %s" % (timeout, states))

    def job_state(self, jid):
        p = self.run("scontrol", "show", "job", "-o", jid, check_rc=False)
        if p.returncode != 0:
            return "GONE"
        m = re.search(r"\bJobState=(\S+)", p.stdout)
        return m.group(1) if m else "UNKNOWN"

    def job_nodes(self, jid):
        p = self.run("scontrol", "show", "job", "-o", jid)
        m = re.search(r"\bNodeList=(\S+)", p.stdout)
        if not m or m.group(1) == "(null)":
            return []
        return self.run("scontrol", "show", "hostnames", m.group(1)).stdout.split()

    def wait_job(self, jid, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.job_state(jid)
            if state in TERMINAL or state == "GONE":
                self.jobs.discard(jid)
                return state
            time.sleep(0.5)
        raise StressError("job %s still %s after %d s" % (jid, self.job_state(jid), timeout))

    def sbatch(self, *args, extra_env=None):
        env = dict(self.env)
        env.update(extra_env or {})
        try:
            p = subprocess.run(["sbatch", "--parsable"] + list(args), env=env, capture_output=True,
                               text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise StressError("sbatch did not answer within 30 s")
        check(p.returncode == 0, "sbatch %s failed: %s" % (" ".join(args), p.stderr))
        jid = p.stdout.strip().split(";")[0]
        self.jobs.add(jid)
        return jid

    def cancel_all(self):
        for jid in list(self.jobs):
            self.run("scancel", jid, check_rc=False)
        self.jobs.clear()

    def fail_node(self, node, demo, wipe=False):
        """The node dies: SIGKILL of every process on it (its UTS namespace)
        but its slurmd — the job's ranks and slurmstepd — then, with `wipe`,
        its local storage is lost (local-cluster.sh wipe), then the node is
        set DOWN. Returns how many of the demo's ranks were killed."""
        pid_file = os.path.join(self.base, "pids", "slurmd-%s.pid" % node)
        with open(pid_file) as f:
            slurmd = f.read().strip()
        uts = os.readlink("/proc/%s/ns/uts" % slurmd)
        check(uts != os.readlink("/proc/self/ns/uts"), "slurmd of %s is not in its own UTS namespace" % node)
        demo_exe = os.path.realpath(demo)
        ranks = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == slurmd:
                continue
            try:
                if os.readlink("/proc/%s/ns/uts" % pid) != uts:
                    continue
                is_rank = os.path.realpath("/proc/%s/exe" % pid) == demo_exe
                os.kill(int(pid), signal.SIGKILL)
                ranks += is_rank
            except OSError:
                pass
        if wipe:
            self.local_cluster("wipe", node, timeout=30)
        self.run("scontrol", "update", "NodeName=" + node, "State=DOWN", "Reason=stress")
        return ranks


# ---- checkpoint directory ----

def step_dirs(root):
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return {}
    return {int(n[5:]): os.path.join(root, n) for n in names
            if n.startswith("step_") and n[5:].isdigit()}


def committed_steps(cluster, root):
    """{step: world_size} of the committed steps, from `mhckpt list --json`."""
    if not os.path.isdir(root):
        return {}
    out = cluster.run(cluster.args.cli, "list", root, "--json", timeout=120).stdout
    return {s["step"]: s["world_size"] for s in json.loads(out)["steps"] if s["committed"]}


def in_flight(root, after):
    """The newest step directory above `after` without a commit marker, or None."""
    steps = step_dirs(root)
    newer = [s for s in steps if s > after]
    if not newer:
        return None
    s = max(newer)
    return s if not os.path.exists(os.path.join(steps[s], "commit.json")) else None


# ---- the local tier: what each node's tmpfs holds ----

def local_snapshot(cluster, nodes, sub):
    """{node: {step: (marker text or None, world size or None, file names)}} of
    the local dir `sub` on each node."""
    snap = {}
    for node in nodes:
        steps = {}
        for step, path in step_dirs(os.path.join(cluster.node_local(node), sub)).items():
            try:
                files = set(os.listdir(path))
            except OSError:
                continue
            text = read(os.path.join(path, "commit.json")) if "commit.json" in files else ""
            world = None
            if text:
                try:
                    world = json.loads(text)["world_size"]
                except (ValueError, KeyError):
                    text = ""
            steps[step] = (text or None, world, files)
        snap[node] = steps
    return snap


def local_restorable(snap, nodes):
    """The local steps a job on `nodes` can restore, ascending (the rule of
    coordinator/local_tier.h, from the files alone): the step's marker on
    some of them and every writer's file w<R>.bin on one of those — of the
    step's newest save where nodes hold different ones (the newest by the
    marker's created_unix_ms; none on a tie); the newest LOCAL_KEEP of them."""
    by_step = {}
    for node in nodes:
        for step, (text, world, files) in snap.get(node, {}).items():
            if text:
                by_step.setdefault(step, []).append((text, world, files))
    whole = []
    for step, held in sorted(by_step.items()):
        created = {t: json.loads(t)["created_unix_ms"] for t, _, _ in held}
        newest = max(created.values())
        if sum(1 for c in created.values() if c == newest) > 1:
            continue  # two saves made at the same moment: neither counts
        text = [t for t, c in created.items() if c == newest][0]
        held = [h for h in held if h[0] == text]
        world = held[0][1]
        files = set().union(*(f for _, _, f in held))
        if all("w%d.bin" % w in files for w in range(world)):
            whole.append(step)
    return whole[-LOCAL_KEEP:]


def local_in_flight(cluster, nodes, sub, after):
    """The newest step above `after` in the local dir of some node of `nodes`
    without its marker there, or None."""
    newest = None
    for node in nodes:
        try:
            dirs = step_dirs(os.path.join(cluster.node_local(node), sub))
        except OSError:
            continue
        for s, path in dirs.items():
            if s > after and not os.path.exists(os.path.join(path, "commit.json")):
                newest = s if newest is None else max(newest, s)
    return newest


LOCAL_KEEP = 2  # Options::local_max_to_keep's default, which the demo keeps


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


# ---- one round ----

class Totals:
    def __init__(self):
        self.rounds = 0
        self.launches = 0
        self.saves = 0                # committed steps (all kept: --max-to-keep 0)
        self.saves_local_only = 0     # --local: commits in the local tier only (the demo's lines)
        self.failures = 0             # launches failed
        self.nodes_failed = 0         # nodes failed (2 per pair failure)
        self.pair_failures = 0        # --local: launches that lost both nodes of a ring pair
        self.restores_local = 0       # --local: relaunches that restored from the local tier
        self.restores_shared = 0      # --local: ... from the shared root
        self.mid_write = 0            # ... while a save was being written
        self.restores = 0             # relaunches that restored
        self.restores_verified = 0    # restore fingerprint == commit fingerprint == data.h5
        self.restores_file_only = 0   # == data.h5 (the commit line was not printed yet)
        self.restore_mismatches = 0
        self.steps_verified = 0       # committed steps through mhckpt verify and numpy
        self.broken_commits = 0
        self.errors = []

    def line(self):
        text = ("rounds %d, launches %d, saves committed %d, failures injected %d "
                "(%d during a write), restores verified %d of %d (%d against data.h5 only), "
                "committed steps verified %d, broken commits %d, restore mismatches %d"
                % (self.rounds, self.launches, self.saves, self.failures, self.mid_write,
                   self.restores_verified, self.restores, self.restores_file_only,
                   self.steps_verified, self.broken_commits, self.restore_mismatches))
        if self.restores_local or self.restores_shared or self.saves_local_only:
            text += ("; local tier: nodes failed (each losing its local storage) %d, of them in "
                     "ring pairs %d, saves committed in the local tier only %d, restores from "
                     "the local tier %d, from the shared root %d"
                     % (self.nodes_failed, self.pair_failures, self.saves_local_only,
                        self.restores_local, self.restores_shared))
        return text


def parse_round(text, local=False):
    kind, _, counts = text.partition(":")
    try:
        nodes = [int(x) for x in counts.split(">")]
    except ValueError:
        nodes = []
    if kind not in ("loop", "sbatch", "pair") or len(nodes) < 2 or min(nodes) < 1:
        raise SystemExit("bad round '%s': want loop:N>M[>...], sbatch:N>M[>...] or pair:N>M[>...]"
                         % text)
    if kind == "pair" and (not local or min(nodes[:-1]) < 2):
        raise SystemExit("round '%s': a pair round needs --local and 2 nodes in each failing launch"
                         % text)
    for a, b in zip(nodes, nodes[1:]):
        if a == b and not local:
            raise SystemExit("round '%s': each relaunch must change the node count (without "
                             "--local, where a failed node comes back empty)" % text)
        if kind == "loop" and b != a - 1:
            raise SystemExit("round '%s': the loop relaunches on the nodes left (N-1)" % text)
    if kind == "loop" and nodes[0] < 2:
        raise SystemExit("round '%s': a loop round needs a node besides the batch host" % text)
    return kind, nodes


def attempt_texts(kind, outputs):
    """The output of each launch, in order."""
    if kind != "loop":
        return outputs
    text = outputs[0]
    starts = [m.start() for m in LOOP_ATTEMPT.finditer(text)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def launch_nodes(cluster, kind, text):
    """The nodes a launch ran on, from its output."""
    m = (LOOP_ATTEMPT if kind == "loop" else SBATCH_NODES).search(text)
    if not m:
        return []
    nodes = m.group(3) if kind == "loop" else m.group(1)
    if kind == "loop":
        return nodes.split(",")
    return cluster.run("scontrol", "show", "hostnames", nodes).stdout.split()


def wait_for_write(cluster, args, kind, outputs_fn, attempt, root, deadline, jid, rng, sub=None):
    """Waits until this launch printed `want` commits (1 to --commits-before, at
    random) and a later save is being written, then a random fraction of
    --kill-delay more, so that failures land in different phases of a save.
    Returns (victim candidates, in-flight step or None)."""
    want = rng.randint(1, args.commits_before)
    nodes = []
    while time.time() < deadline:
        texts = attempt_texts(kind, outputs_fn())
        if len(texts) >= attempt:
            text = texts[attempt - 1]
            commits = [int(s) for s in COMMITTED.findall(text)]
            check(not DONE.search(text),
                  "launch %d finished before a failure could be injected: raise --steps" % attempt)
            if len(commits) >= want:
                if kind == "loop":
                    m = LOOP_ATTEMPT.search(text)
                    nodes = m.group(3).split(",")
                else:
                    nodes = cluster.job_nodes(jid)
                break
        state = cluster.job_state(jid)
        check(state not in TERMINAL and state != "GONE",
              "job %s ended (%s) before launch %d committed %d steps"
              % (jid, state, attempt, want))
        time.sleep(0.1)
    else:
        raise StressError("launch %d: no %d commits within the time limit" % (attempt, want))
    last = max(commits)
    # Catch a save in flight: its directory exists, its marker does not (in
    # the shared root, or with --local in a node's local dir).
    catch_deadline = min(deadline, time.time() + args.catch_seconds)
    while time.time() < catch_deadline:
        s = in_flight(root, last)
        if s is None and sub is not None:
            s = local_in_flight(cluster, nodes, sub, last)
        if s is not None:
            time.sleep(rng.uniform(0, args.kill_delay))
            return nodes, s
        time.sleep(0.02)
    return nodes, None


def run_round(cluster, args, index, spec, totals, rng):
    kind, counts = spec
    name = "round%02d_%s_%s" % (index, kind, "-".join(map(str, counts)))
    work = os.path.join(args.work, name)
    root = os.path.join(work, "ckpt")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t_round = time.time()
    deadline = t_round + args.round_timeout
    log("== %s: %s on %s nodes%s" % (name, "relaunch loop" if kind == "loop" else "sbatch jobs",
                                     " -> ".join(map(str, counts)),
                                     ", two tiers" if args.local else ""))
    available = cluster.restore_nodes()
    check(max(counts) <= available, "%s needs %d nodes, the cluster has %d"
          % (name, max(counts), available))

    more = ["--log-every", str(args.save_every), "--seed", str(rng.randint(1, 1 << 30))]
    # --local: the demo's local dir on each node's own tmpfs, one per round.
    sub = name if args.local else None
    if args.local:
        more += ["--local-dir", os.path.join(cluster.local, sub),
                 "--persistent-every", str(args.persistent_every)]
    demo_args = [args.demo, "--dir", root, "--steps", str(args.steps), "--save-every",
                 str(args.save_every), "--model-mib", str(args.model_mib), "--max-to-keep", "0"] + more
    outs = []
    jobs = []
    latest_at_failure = []   # per failed launch: newest committed step once it ended
    failed_in_flight = []    # per failed launch: the step being written (or None)
    local_at_failure = []    # --local: per failed launch, every node's local dir once it ended
    lost_pair = []           # per failed launch: two ring neighbours failed
    train_env = {"MHCKPT_CKPT_DIR": root, "MHCKPT_BIN_DIR": os.path.dirname(args.demo),
                 "MHCKPT_DEMO_STEPS": str(args.steps), "MHCKPT_DEMO_SAVE_EVERY": str(args.save_every),
                 "MHCKPT_DEMO_MIB": str(args.model_mib), "MHCKPT_DEMO_MAX_TO_KEEP": "0",
                 "MHCKPT_DEMO_ARGS": " ".join(more),
                 "MHCKPT_SLURM_DIR": HERE}

    def submit(n, attempt):
        out = os.path.join(work, "launch%d.out" % attempt if kind != "loop" else "job.out")
        outs.append(out)
        if kind == "loop":
            jid = cluster.sbatch("--no-kill", "-N", str(n), "--ntasks-per-node=1", "-o", out,
                                 "-D", work, "-J", name,
                                 os.path.join(HERE, "relaunch-loop.sh"), "--attempts",
                                 str(len(counts) + 1), "--ckpt-dir", root, "--mhckpt", args.cli,
                                 "--delay", "2", "--launcher", args.loop_launcher, "--", *demo_args)
        else:
            # --no-requeue: the node failure must end the job (NODE_FAIL)
            # rather than Slurm requeueing it on its own.
            jid = cluster.sbatch("--no-requeue", "-N", str(n), "--ntasks-per-node=1", "-o", out, "-D", work,
                                 "-J", name, os.path.join(HERE, "train.sbatch"),
                                 extra_env=train_env)
        jobs.append(jid)
        return jid

    def make_room(n):
        """Brings failed nodes back (State=RESUME) if fewer than n are up."""
        up = [s for s in cluster.node_states().values() if s in ("idle", "mixed", "allocated")]
        if len(up) < n:
            log("%d nodes up, %d wanted: RESUME of the failed ones" % (len(up), n))
            cluster.restore_nodes()

    outputs = lambda: [read(o) for o in outs]
    jid = submit(counts[0], 1)
    for attempt in range(1, len(counts)):
        if kind != "loop" and attempt > 1:
            make_room(counts[attempt - 1])
            jid = submit(counts[attempt - 1], attempt)
        nodes, flying = wait_for_write(cluster, args, kind, outputs, attempt, root, deadline, jid, rng,
                                       sub)
        if kind == "pair":
            # Rank k runs on the k-th node of the job (srun's block
            # distribution, one task per node), and the local tier's ring
            # keeps its copy on the next: nodes k and k + 1 hold both.
            k = rng.randrange(len(nodes))
            victims = [nodes[k], nodes[(k + 1) % len(nodes)]]
        else:
            candidates = nodes[1:] if kind == "loop" else nodes   # the loop's batch host survives
            victims = [rng.choice(candidates)]
        killed = sum(cluster.fail_node(v, args.demo, wipe=args.local) for v in victims)
        totals.failures += 1
        totals.nodes_failed += len(victims)
        totals.pair_failures += kind == "pair"
        lost_pair.append(kind == "pair")
        log("launch %d on %s: failed node%s %s (SIGKILL of its processes, %d rank(s)%s; State=DOWN) %s"
            % (attempt, ",".join(nodes), "s" if len(victims) > 1 else "", ",".join(victims), killed,
               "; local storage wiped" if args.local else "",
               "while step %d was being written" % flying if flying is not None
               else "(no save caught in flight)"))
        failed_in_flight.append(flying)
        # The failed launch is over when the loop says so, or the job ended.
        while True:
            check(time.time() < deadline, "%s: launch %d did not end after the failure" % (name, attempt))
            if kind != "loop":
                state = cluster.wait_job(jid, max(1, deadline - time.time()))
                check(state in ("NODE_FAIL", "FAILED", "GONE"),
                      "launch %d ended %s after its node failed, expected NODE_FAIL" % (attempt, state))
                break
            if re.search(r"^relaunch-loop: attempt %d/\d+: failed" % attempt, outputs()[0], re.M):
                break
            check(cluster.job_state(jid) not in TERMINAL, "the relaunch loop's job ended early")
            time.sleep(0.1)
        latest_at_failure.append(max(committed_steps(cluster, root) or {None: 0}))
        if args.local:
            local_at_failure.append(local_snapshot(cluster, cluster.all_nodes(), sub))
        totals.launches += 1
    if kind != "loop":
        make_room(counts[-1])
        jid = submit(counts[-1], len(counts))
    state = cluster.wait_job(jid, max(1, deadline - time.time()))
    totals.launches += 1
    texts = attempt_texts(kind, outputs())
    check(state in ("COMPLETED", "GONE") and texts and DONE.search(texts[-1]),
          "%s: the last launch did not finish (job %s %s); output in %s"
          % (name, jid, state, ", ".join(outs)))
    check(len(texts) == len(counts), "%s: %d launches, expected %d" % (name, len(texts), len(counts)))

    # Commit-time fingerprints, by (step, ranks of the launch that printed them).
    printed = {}
    for i, text in enumerate(texts):
        ranks = int(MODEL.search(text).group(1)) if MODEL.search(text) else None
        check(ranks == counts[i], "%s: launch %d ran %s ranks, expected %d" % (name, i + 1, ranks, counts[i]))
        restored = RESTORED.search(text)
        fps = FINGERPRINT.findall(text)
        if restored:
            fps = fps[1:]   # the first fingerprint line is the restore's
        for s in COMMITTED.findall(text):
            fp = dict(fps).get(s)
            if fp:
                printed[(int(s), ranks)] = fp
        totals.saves_local_only += len(COMMITTED_LOCAL_ONLY.findall(text))

    # Every committed step: mhckpt verify, and data.h5 against the printed fingerprint.
    committed = committed_steps(cluster, root)
    totals.saves += len(committed)
    p = cluster.run(args.cli, "verify", root, "--all", timeout=300, check_rc=False)
    verify_failed = p.returncode != 0
    if verify_failed:
        log("%s: mhckpt verify --all failed:\n%s%s" % (name, p.stdout, p.stderr))
    file_fp = {}
    for step, world in sorted(committed.items()):
        file_fp[step] = file_fingerprint(step_dirs(root)[step])
        want = printed.get((step, world))
        bad = verify_failed and ("step %d" % step) in (p.stdout + p.stderr)
        if want is not None and want != file_fp[step]:
            bad = True
            log("%s: step %d (committed at %d ranks): data.h5 hashes to %s, %s was printed at commit"
                % (name, step, world, file_fp[step], want))
        if bad:
            totals.broken_commits += 1
        totals.steps_verified += 1
    if verify_failed and totals.broken_commits == 0:
        totals.broken_commits += 1   # verify failed on something it did not name by step

    # Each relaunch restored the newest committed step, bit for bit.
    for i in range(1, len(counts)):
        text = texts[i]
        m = RESTORED.search(text)
        check(m is not None, "%s: launch %d did not restore" % (name, i + 1))
        step, ranks = int(m.group(1)), int(m.group(2))
        restore_fp = FINGERPRINT.findall(text)[0]
        check(restore_fp[0] == str(step), "%s: launch %d: no fingerprint after its restore" % (name, i + 1))
        totals.restores += 1
        want_step = latest_at_failure[i - 1]
        commit_fp = printed.get((step, counts[i - 1]))
        if not args.local:
            ok = step == want_step and ranks == counts[i]
            ok = ok and file_fp.get(step) == restore_fp[1]
            if commit_fp is not None:
                ok = ok and commit_fp == restore_fp[1]
            if ok:
                totals.restores_verified += 1
                if commit_fp is None:
                    totals.restores_file_only += 1
            else:
                totals.restore_mismatches += 1
            log("launch %d: %d nodes, restored step %d (newest committed: %s) fingerprint %s; at commit %s, "
                "data.h5 %s: %s" % (i + 1, counts[i], step, want_step, restore_fp[1], commit_fp or "(not printed)",
                                    file_fp.get(step), "OK" if ok else "MISMATCH"))
        else:
            # The newest step with a surviving copy: the shared root's newest,
            # or a newer (or the same) local step whose files survive on the
            # relaunch's nodes, which the local tier then serves.
            relaunch_nodes = launch_nodes(cluster, kind, text)
            check(len(relaunch_nodes) == counts[i], "%s: launch %d ran on nodes %s, expected %d"
                  % (name, i + 1, relaunch_nodes, counts[i]))
            local = local_restorable(local_at_failure[i - 1], relaunch_nodes)
            newest_local = local[-1] if local else 0
            want_tier = "local tier" if local and newest_local >= want_step else "shared root"
            want_step = max(want_step, newest_local)
            tier = RESTORED_TIER.search(text)
            tier = tier.group(1) if tier else None
            # The fingerprint printed when the state was saved: the newest
            # launch before this one that saved the step.
            saved_fp = None
            for j in range(i - 1, -1, -1):
                saved_fp = dict(SAVING.findall(texts[j])).get(str(step))
                if saved_fp:
                    break
            ok = (step == want_step and ranks == counts[i] and tier == want_tier
                  and saved_fp == restore_fp[1])
            if step in file_fp:
                ok = ok and file_fp[step] == restore_fp[1]
            if commit_fp is not None:
                ok = ok and commit_fp == restore_fp[1]
            if lost_pair[i - 1]:
                # Both copies of a rank's boxes were lost: no local step can
                # be whole, and the shared root's newest step is the answer.
                ok = ok and tier == "shared root" and not local
            if ok:
                totals.restores_verified += 1
                if tier == "local tier":
                    totals.restores_local += 1
                else:
                    totals.restores_shared += 1
            else:
                totals.restore_mismatches += 1
            log("launch %d: %d nodes (%s), restored step %d from the %s (newest surviving: %s in the "
                "shared root, local steps %s on these nodes: step %d from the %s) fingerprint %s; "
                "at save %s, at commit %s, data.h5 %s: %s"
                % (i + 1, counts[i], ",".join(relaunch_nodes), step, tier, latest_at_failure[i - 1],
                   local, want_step, want_tier, restore_fp[1], saved_fp, commit_fp or "(not printed)",
                   file_fp.get(step, "(none: local only)"), "OK" if ok else "MISMATCH"))
        flying = failed_in_flight[i - 1]
        # The save being written when the node failed: never committed by the failed launch.
        if flying is not None:
            if committed.get(flying) == counts[i - 1] and flying <= step:
                log("launch %d: step %d committed before the failure took effect" % (i, flying))
            else:
                totals.mid_write += 1
    totals.rounds += 1
    log("%s: OK in %.0f s (%d committed steps, all verified)" % (name, time.time() - t_round, len(committed)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(HERE)
    parser.add_argument("--rounds", default="loop:3>2",
                        help="comma-separated KIND:N>M[>...] (default loop:3>2)")
    parser.add_argument("--repeat", type=int, default=1, help="run the list of rounds this many times")
    parser.add_argument("--up", type=int, metavar="NODES",
                        help="bring the local cluster up with NODES nodes first, and down at the end")
    parser.add_argument("--work", default="/tmp/mhckpt-stress", help="checkpoints and job output")
    parser.add_argument("--demo", default=os.path.join(root, "build/bin/mhckpt-train-demo"))
    parser.add_argument("--cli", default=os.path.join(root, "build/bin/mhckpt"))
    parser.add_argument("--model-mib", type=float, default=8, help="sharded state per save")
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--steps", type=int, default=80, help="each round trains to this step")
    parser.add_argument("--commits-before", type=int, default=2,
                        help="a launch prints 1 to this many commits (at random) before its node fails")
    parser.add_argument("--kill-delay", type=float, default=0.3,
                        help="seconds (at most, at random) between seeing a save in flight and the failure")
    parser.add_argument("--catch-seconds", type=float, default=10,
                        help="how long to wait for a save in flight before failing the node anyway")
    parser.add_argument("--round-timeout", type=float, default=150)
    parser.add_argument("--loop-launcher", default="auto", choices=["auto", "srun", "mpirun"],
                        help="relaunch-loop.sh --launcher: auto launches with mpirun when the surviving nodes "
                             "leave a gap in the allocation (n1,n3 of n1-n3), which Slurm 22.05's PMIx plugin "
                             "cannot wire up on the local cluster (docs/SLURM.md)")
    parser.add_argument("--local", action="store_true",
                        help="the demo saves with the local tier on each node's own tmpfs; a failed node "
                             "loses it (see above)")
    parser.add_argument("--persistent-every", type=int, default=3,
                        help="--local: every Nth save of a launch also goes to the shared root")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the counts here as JSON")
    args = parser.parse_args()
    rounds = [parse_round(r, args.local) for r in args.rounds.split(",") if r] * args.repeat
    for f in (args.demo, args.cli):
        if not os.access(f, os.X_OK):
            raise SystemExit("stress: %s is not built (cmake --build build)" % f)
    args.work = os.path.abspath(args.work)
    args.demo = os.path.abspath(args.demo)
    args.cli = os.path.abspath(args.cli)
    os.makedirs(args.work, exist_ok=True)

    # SIGTERM (ctest's timeout, a person's kill) ends like Ctrl-C: jobs
    # cancelled, the cluster taken down if this run brought it up.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    cluster = Cluster(args)
    totals = Totals()
    rng = random.Random(args.seed)
    t0 = time.time()
    status = 1
    try:
        if args.up:
            cluster.local_cluster("up", str(args.up))
        cluster.run("sinfo", timeout=15)
        for i, spec in enumerate(rounds, 1):
            try:
                run_round(cluster, args, i, spec, totals, rng)
            except StressError as e:
                totals.errors.append("round %d: %s" % (i, e))
                log("round %d FAILED: %s" % (i, e))
                cluster.cancel_all()
        ok = (not totals.errors and totals.broken_commits == 0 and totals.restore_mismatches == 0
              and totals.restores_verified == totals.restores == totals.failures)
        status = 0 if ok else 1
    except StressError as e:
        totals.errors.append(str(e))
        log("FAILED: %s" % e)
    except KeyboardInterrupt:
        totals.errors.append("interrupted")
        log("interrupted")
    finally:
        cluster.cancel_all()
        if args.up:
            try:
                cluster.local_cluster("down", timeout=60)
            except StressError as e:
                log("taking the cluster down: %s" % e)
    elapsed = time.time() - t0
    log("%s; %.0f s" % (totals.line(), elapsed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(vars(totals), seconds=round(elapsed, 1), rounds_spec=args.rounds,
                           repeat=args.repeat, model_mib=args.model_mib, local=args.local,
                           persistent_every=args.persistent_every if args.local else None,
                           ok=status == 0), f, indent=1)
    log("PASSED" if status == 0 else "FAILED: " + "; ".join(totals.errors or ["counts above"]))
    return status


if __name__ == "__main__":
    sys.exit(main())
