#!/usr/bin/python3
"""Crash tests with real jobs: mpirun runs tests/crash_job, a rank dies at a
fault point of the save protocol or at a random moment, and a later job at
another world size checks what is on disk.

    crash_test.py phases --job BIN --work DIR --mpiexec "mpiexec --oversubscribe ..." [--np 2,3,4]
                         [--share I/N]
    crash_test.py local  --job BIN --work DIR --mpiexec "..." [--np 2,3,4] [--share I/N]
    crash_test.py random --job BIN --work DIR --mpiexec "..." [--trials 20] [--seed S] [--local]

phases: for every fault point x action (exit, kill) at each world size, job A
  saves step 1, job B saves step 2 with MHCKPT_FAULT on one rank and must die
  there, then `crash_job check` at a different world size must find step 2
  neither listed nor on disk after Open, and step 1 restoring bit-exactly and
  verifying (retention, with --max-to-keep 1: step 2 committed and intact,
  step 1 gone). --share I/N runs every N-th case from the I-th (ctest's
  default suite deals the 16 cases out over np 2, 3 and 4; label long runs
  all of them at each size). Control cases first show that the checks can fail: a flipped
  data byte, a forged checksum and a truncated marker must each be caught.

local: the same with the local tier, nodes simulated on this machine (see
  LOCAL_RPN and LOCAL_CHECK below). Job A saves step 1 to both tiers and step
  2 to the local tier only; job B saves step 3 and one rank dies (exit, kill)
  at local_create, local_write, local_exchange, before_local_marker, the local
  marker's mid_marker, or, with step 3 for both tiers, in the shared root's
  write after the local commit (mid_write, before_marker). A job on other
  nodes and another world size must then list exactly the steps that the
  files left predict (the shared root's committed steps, and the newest 2
  local steps whose every writer file lies on a node of the job that holds
  the step's marker), and restore each bit-exactly; the case also states its
  own outcome (before the local commit: newest step 2; after it: step 3 from
  the local tier). Controls: no fault; a flipped byte in every copy of a local
  file must be caught; a lost node (its dir wiped) restores from the copies;
  a lost partner pair falls back to the shared root. --share deals the
  controls and the 14 cases together.

random: `crash_job loop` at a random world size in 2..4, SIGKILL of a random
  rank (sometimes of every rank, in the last trial at the latest) after a
  random delay, then a check at another world size that restores and
  verifies every step it has not verified yet, the newest, and three older
  ones. Counts broken commits (a listed step that does not restore or
  verify) and lost steps (seen committed, or acknowledged to the job, and
  gone later, or a gap; retention is off). Both must be 0, no
  job may hang (mpirun must exit within 60 s of the kill; a hung job's ranks
  are backtraced with gdb and killed). Every --fresh-root-every trials (or
  --max-steps-per-root committed steps), a check restores every committed step
  and the test moves on to a fresh root (this bounds disk use and check time).

  With --local the loop saves with the local tier (nodes simulated as in
  mode local; --persistent-every 3), and a kill leaves every node's local dir
  in place (a process crash, not a node loss). Local steps may then go
  (local retention keeps 2; a check on fewer nodes may not see them), so the
  rules change: each check must list exactly what the files predict for its
  nodes (local_oracle) and restore what it restores bit-exactly; a step of
  the shared root, seen by a check or acknowledged to the loop (save k of a
  loop job goes there if k % 3 == 0), must never go; and the newest step
  acknowledged to the loop must be listed by a check on the same nodes or
  more (also when a node outside the loop's job kept an older save of that
  step number, made by an earlier job: the newest save is the step).

  Long run (docs/TESTING.md):
    crash_test.py random --trials 300 --seed 4 --job build/bin/crash_job \
        --work /tmp/crash-long --mpiexec "mpiexec --oversubscribe --mca mpi_yield_when_idle 1 \
        --mca btl_vader_single_copy_mechanism none"

Exit status: 0 if every expectation held, 1 otherwise.
"""
import argparse
import importlib.util
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from hang_report import backtraces, children_of

import step_files

# Points of base/fault.h that a crash can hit during a save, with the rank
# that must carry the fault (None: any rank; the test picks one).
POINTS = {
    "after_snapshot": None,
    "plan": None,
    "mid_write": None,
    "after_flush": None,
    "index_write": None,
    "before_marker": 0,
    "mid_marker": 0,
    "retention": 0,
}
ACTIONS = ("exit", "kill")
JOB_TIMEOUT = 60  # seconds; a job that outlives it is hung (a failure)


def step_dir(root, step):
    return os.path.join(root, "step_%010d" % step)


def on_disk(root):
    """{step: set of file names} of every step directory under root."""
    out = {}
    if not os.path.isdir(root):
        return out
    for name in os.listdir(root):
        if name.startswith("step_") and len(name) == 15 and name[5:].isdigit():
            out[int(name[5:])] = set(os.listdir(os.path.join(root, name)))
    return out


class Job:
    """One mpirun, its output going to a file (an orphaned rank holding a pipe
    can never block the reader)."""

    def __init__(self, proc, log):
        self.proc, self.log = proc, log
        self.pid = proc.pid

    def output(self):
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        return text


class Runner:
    def __init__(self, args):
        self.job = args.job
        self.mpiexec = shlex.split(args.mpiexec)
        self.np_flag = args.np_flag
        self.ranks_per_file = args.ranks_per_file
        self.verbose = args.verbose
        self.hangs = 0
        self.hang_reports = []

    def command(self, np, *job_args):
        extra = ["--ranks-per-file", str(self.ranks_per_file)] if self.ranks_per_file else []
        return (self.mpiexec + [self.np_flag, str(np), self.job] + [str(a) for a in job_args] +
                extra)

    def start(self, np, *job_args, fault=None):
        env = dict(os.environ)
        env.pop("MHCKPT_FAULT", None)
        if fault:
            env["MHCKPT_FAULT"] = fault
        cmd = self.command(np, *job_args)
        if self.verbose:
            print("$ %s%s" % ("MHCKPT_FAULT=%s " % fault if fault else "", " ".join(cmd)))
        log = tempfile.TemporaryFile(mode="w+")
        # A session of its own, so that a hung job can be killed as a whole.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
                                start_new_session=True)
        return Job(proc, log)

    def finish(self, job, timeout=JOB_TIMEOUT):
        """(returncode, output); returncode None if the job hung and was killed.
        A hung job's ranks are backtraced (gdb) into the output, then killed:
        Open MPI puts each rank in a process group of its own."""
        try:
            job.proc.wait(timeout=timeout)
            return job.proc.returncode, job.output()
        except subprocess.TimeoutExpired:
            pass
        self.hangs += 1
        ranks = children_of(job.pid)
        report = "HANG: mpirun pid %d still running after %d s; ranks %s\n%s" % (
            job.pid, timeout, ranks, backtraces(ranks))
        for pid in [job.pid] + ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.proc.wait()
        out = job.output() + "\n" + report
        self.hang_reports.append(report)
        print(report)
        return None, out

    def run(self, np, *job_args, fault=None, timeout=JOB_TIMEOUT):
        return self.finish(self.start(np, *job_args, fault=fault), timeout)

    def check(self, np, root, steps="all", rows=None, timeout=JOB_TIMEOUT, extra=()):
        """Runs `crash_job check`: (returncode, report dict or None, output)."""
        extra = ["--steps", steps] + (["--rows", rows] if rows else []) + list(extra)
        rc, out = self.run(np, "check", root, *extra, timeout=timeout)
        report = None
        for line in out.splitlines():
            if line.startswith("CRASHCHECK "):
                report = json.loads(line[len("CRASHCHECK "):])
        return rc, report, out


# ---------------------------------------------------------------------------
# Phase matrix

def expect_after_check(rc, report, committed, gone):
    """Problems with a check's outcome: `committed` must be exactly the listed
    steps, all restored and verified, nothing failed, steps in `gone` absent
    from disk after Open."""
    problems = []
    if report is None:
        return ["check printed no report (rc %s)" % rc]
    if rc != 0:
        problems.append("check exited %s" % rc)
    if report["committed"] != committed:
        problems.append("committed steps %s, expected %s" % (report["committed"], committed))
    if report["checked_ok"] != committed:
        problems.append("restored and verified %s, expected %s" % (report["checked_ok"], committed))
    if report["failed"]:
        problems.append("failed: %s" % report["failed"])
    for s in gone:
        if s in report["dirs_after_open"]:
            problems.append("step %d still on disk after Open" % s)
    if report["dirs_after_open"] != committed:
        problems.append("directories after Open %s, expected %s"
                        % (report["dirs_after_open"], committed))
    return problems


def debris_problems(point, disk):
    """What a crash at `point` during step 2 must have left (before any Open):
    proof that the crash happened where it was meant to."""
    problems = []
    if 1 not in disk:
        problems.append("step 1 directory missing before check")
    s2 = disk.get(2)
    if point in ("mid_write", "after_flush", "index_write", "before_marker"):
        if s2 is None or "data.h5" not in s2 or "commit.json" in s2:
            problems.append("expected an uncommitted step 2 with data.h5, found %s" % s2)
        # Format 3: each rank puts its index records before its flush ends.
        if point != "mid_write" and (s2 is None or "index.bin" not in s2):
            problems.append("expected step 2's index.bin, found %s" % s2)
    elif point == "mid_marker":
        if s2 is None or "commit.json.tmp" not in s2 or "commit.json" in s2:
            problems.append("expected step 2 with commit.json.tmp and no commit.json, found %s"
                            % s2)
    elif point == "retention":
        if s2 is None or "commit.json" not in s2:
            problems.append("expected step 2 committed, found %s" % s2)
        if "commit.json" in disk.get(1, set()):
            problems.append("expected step 1's marker unlinked, found %s" % disk.get(1))
    elif s2 is not None and "commit.json" in s2:
        problems.append("step 2 committed although rank died at %s" % point)
    return problems


def fresh_copy(template, dest):
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(template, dest)
    return os.path.join(dest, "ckpt")


def flip_data_byte(root, step, array="params/w", offset=4097):
    import h5py  # Debian's /usr/bin/python3 has it (the caller skips without)
    path = os.path.join(step_dir(root, step), "data.h5")
    with h5py.File(path, "r") as f:
        where = f[array].id.get_offset() + offset
    with open(path, "r+b") as f:
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0x10]))


def have_h5py():
    return importlib.util.find_spec("h5py") is not None


def forge_checksum(root, step, array="params/w"):
    """The checksum of the array's first box, forged: in the marker (format
    2) or in the step's index (format 3: a flipped byte of its record)."""
    marker = step_files.read_marker(root, step)
    if marker["format_version"] >= 3:
        record = step_files.record_of(marker, array, 0)
        step_files.flip_byte(step_files.index_path(root, step), record["offset"])
        return
    box = [a for a in marker["arrays"] if a["name"] == array][0]["boxes"][0]
    digits = box["checksum"]
    last = digits[-1]
    box["checksum"] = digits[:-1] + ("0" if last != "0" else "1")
    step_files.write_marker(root, step, marker)


def truncate_marker(root, step):
    path = os.path.join(step_dir(root, step), "commit.json")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


CHECK_NP = {1: 2, 2: 3, 3: 1, 4: 2}  # another world size for the checking job


def run_phases(args):
    runner = Runner(args)
    failures = []
    cases = 0

    def fail(case, problems, output=""):
        if problems:
            failures.append((case, problems))
            print("FAIL %s:\n  %s" % (case, "\n  ".join(problems)))
            if output:
                tail = output.splitlines()[-40:]
                print("  --- output ---\n" + "\n".join("  | " + line for line in tail))
        else:
            print("ok   %s" % case)

    for np in [int(n) for n in args.np.split(",")]:
        check_np = CHECK_NP[np]
        base = os.path.join(args.work, "np%d" % np)
        shutil.rmtree(base, ignore_errors=True)
        template = os.path.join(base, "template")
        rc, out = runner.run(np, "save", os.path.join(template, "ckpt"), 1, 1)
        if rc != 0:
            fail("np%d job A (save step 1)" % np, ["exited %s" % rc], out)
            continue

        # Controls: the checks must see a good step 2, and must catch damage.
        if not args.no_controls:
            cases += 1
            root = fresh_copy(template, os.path.join(base, "control-nofault"))
            rc, out = runner.run(np, "save", root, 2, 2)
            problems = [] if rc == 0 else ["job B without a fault exited %s" % rc]
            crc, report, cout = runner.check(check_np, root)
            problems += expect_after_check(crc, report, [1, 2], [])
            fail("np%d control: no fault, step 2 commits" % np, problems, out + cout)

            for name, damage, expect in (
                    ("flipped data byte", flip_data_byte, "verify"),
                    ("forged checksum in marker or index", forge_checksum, "verify")):
                if damage is flip_data_byte and not have_h5py():
                    print("skip np%d control: %s (no h5py to find the data)" % (np, name))
                    continue
                cases += 1
                root = fresh_copy(template, os.path.join(base, "control-" + damage.__name__))
                damage(root, 1)
                crc, report, cout = runner.check(check_np, root)
                problems = []
                if crc == 0:
                    problems.append("check exited 0 on a damaged step")
                if report is None or "1" not in report["failed"]:
                    problems.append("check did not report step 1 as failed")
                elif expect not in report["failed"]["1"] or "params/w" not in report["failed"]["1"]:
                    problems.append("failure does not name %s and the array: %s"
                                    % (expect, report["failed"]["1"]))
                # The harness's own expectation must reject it too.
                if not expect_after_check(crc, report, [1], []):
                    problems.append("expect_after_check accepted a damaged step")
                fail("np%d control: %s is caught" % (np, name), problems, cout)

            cases += 1
            root = fresh_copy(template, os.path.join(base, "control-truncated-marker"))
            truncate_marker(root, 1)
            crc, report, cout = runner.check(check_np, root)
            problems = []
            if report is None or report["committed"] != []:
                problems.append("a truncated marker still counts as committed")
            if not expect_after_check(crc, report, [1], []):
                problems.append("expect_after_check accepted a lost step")
            fail("np%d control: truncated marker is not committed" % np, problems, cout)

        share, shares = args.share
        for k, (point, action) in enumerate((p, a) for p in POINTS for a in ACTIONS):
            if k % shares != share:
                continue
            fixed_rank = POINTS[point]
            cases += 1
            # Rank 0 and the last rank both get faults at the shared points.
            rank = fixed_rank if fixed_rank is not None else (0 if action == "exit" else np - 1)
            case = "np%d %s %s rank %d (check at np%d)" % (np, point, action, rank, check_np)
            root = fresh_copy(template, os.path.join(base, "%s-%s" % (point, action)))
            fault = "rank=%d,point=%s,action=%s,step=2" % (rank, point, action)
            if point == "mid_write":
                fault += ",after_bytes=65536"
            keep = ["--max-to-keep", 1] if point == "retention" else []
            rc, out = runner.run(np, "save", root, 2, 2, *keep, fault=fault)
            problems = []
            if rc is None:
                problems.append("job B hung")
            elif rc == 0:
                problems.append("job B succeeded although rank %d should have died" % rank)
            word = "exit" if action == "exit" else "SIGKILL"
            if "injected %s at %s on rank %d" % (word, point, rank) not in out:
                problems.append("the fault did not fire")
            problems += debris_problems(point, on_disk(root))
            if point == "retention":
                committed, gone = [2], [1]
            else:
                committed, gone = [1], [2]
            crc, report, cout = runner.check(check_np, root)
            problems += expect_after_check(crc, report, committed, gone)
            fail(case, problems, out + cout)

    print("\nphases: %d cases, %d failed, %d hung jobs" % (cases, len(failures), runner.hangs))
    return 1 if failures or runner.hangs else 0


# ---------------------------------------------------------------------------
# The local tier (Options::local_dir): crashes during a two-tier save

# Nodes are simulated (crash_job --local-dir BASE --ranks-per-node K: rank R
# on node R / K, its local dir BASE/node<R / K>). The crashing job runs at
# np with LOCAL_RPN[np] ranks per node; the checking job at LOCAL_CHECK[np] =
# (np, ranks per node): np2's 2 nodes are checked on 3 (a new, empty node
# joins), np3's 3 nodes on 2 (node 2 is gone: its ranks' boxes come from the
# copies on node 0), np4's 2 nodes of 2 ranks on the same 2 nodes with 1 rank
# each.
LOCAL_RPN = {2: 1, 3: 1, 4: 2}
LOCAL_CHECK = {2: (3, 1), 3: (2, 1), 4: (2, 1)}
LOCAL_KEEP = 2  # Options::local_max_to_keep's default

# Step 3's save dies at these points: (name, fault point, tier of step 3,
# rank that must carry it: None any, "leader" a node's lowest rank, 0 rank 0).
# mid_marker on rank 0 is the local marker's (it comes first); the drain
# points are the shared root's write after step 3 committed in the local tier.
LOCAL_POINTS = [
    ("local_create", "local_create", "local", None),
    ("local_write", "local_write", "local", None),
    ("local_exchange", "local_exchange", "local", None),
    ("before_local_marker", "before_local_marker", "local", "leader"),
    ("local mid_marker", "mid_marker", "local", 0),
    ("drain mid_write", "mid_write", "persistent", None),
    ("drain before_marker", "before_marker", "persistent", 0),
]
PRE_COMMIT = ("local_create", "local_write", "local_exchange")


def local_steps_on_disk(base, nodes):
    """{step: {node: set of file names}} of the step directories of BASE/node<N>, N < nodes."""
    out = {}
    for n in range(nodes):
        for s, files in on_disk(os.path.join(base, "node%d" % n)).items():
            out.setdefault(s, {})[n] = files
    return out


def local_oracle(root, base, nodes):
    """What a job on nodes 0..nodes-1 must list, from the files alone (an
    implementation of the recovery rule independent of the library's): the
    shared root's steps with a commit marker, and the newest LOCAL_KEEP local
    steps whose every writer file w<R>.bin lies on some node (of those) that
    holds the step's marker — of the step's newest save, where nodes hold
    different saves of it (markers that differ; the newest by created_unix_ms,
    none on a tie). Returns (steps, {step: "local"|"persistent"|"both"})."""
    persistent = {s for s, files in on_disk(root).items() if "commit.json" in files}
    whole = []
    for s, by_node in sorted(local_steps_on_disk(base, nodes).items()):
        marked = [n for n, files in by_node.items() if "commit.json" in files]
        if not marked:
            continue
        text_of = {}
        for n in marked:
            with open(os.path.join(base, "node%d" % n, "step_%010d" % s, "commit.json")) as f:
                text_of[n] = f.read()
        created = {t: json.loads(t)["created_unix_ms"] for t in text_of.values()}
        newest = max(created.values())
        if sum(1 for c in created.values() if c == newest) > 1:
            continue  # two saves made at the same moment: neither counts
        text = [t for t, c in created.items() if c == newest][0]
        world = json.loads(text)["world_size"]
        held = set()
        for n in marked:
            if text_of[n] == text:
                held |= by_node[n]
        if all("w%d.bin" % w in held for w in range(world)):
            whole.append(s)
    local = set(whole[-LOCAL_KEEP:])
    tiers = {}
    for s in persistent | local:
        tiers[str(s)] = ("both" if s in persistent and s in local
                         else "local" if s in local else "persistent")
    return sorted(persistent | local), tiers


def local_conflicts(base, nodes):
    """The local steps of which nodes 0..nodes-1 hold different markers."""
    out = set()
    for s, by_node in local_steps_on_disk(base, nodes).items():
        texts = set()
        for n, files in by_node.items():
            if "commit.json" in files:
                with open(os.path.join(base, "node%d" % n, "step_%010d" % s, "commit.json")) as f:
                    texts.add(f.read())
        if len(texts) > 1:
            out.add(s)
    return out


def expect_local_check(rc, report, want, tiers):
    """Problems with a check of a two-tier root: exactly `want` listed with
    `tiers`, every one restored bit-exactly (and verified where the shared
    root holds it)."""
    if report is None:
        return ["check printed no report (rc %s)" % rc]
    problems = []
    if rc != 0:
        problems.append("check exited %s" % rc)
    if report["committed"] != want:
        problems.append("committed steps %s, expected %s" % (report["committed"], want))
    if report.get("tiers") != tiers:
        problems.append("tiers %s, expected %s" % (report.get("tiers"), tiers))
    if report["checked_ok"] != report["committed"]:
        problems.append("restored bit-exactly %s of %s" % (report["checked_ok"], report["committed"]))
    if report["failed"]:
        problems.append("failed: %s" % report["failed"])
    return problems


def local_debris(point, np, rpn, rank, root, base):
    """Proof that step 3's save died where it was meant to (before any Open)."""
    nodes = (np + rpn - 1) // rpn
    disk = local_steps_on_disk(base, nodes)
    s3 = disk.get(3, {})
    marked = sorted(n for n, f in s3.items() if "commit.json" in f)
    node = rank // rpn
    problems = []
    if point in PRE_COMMIT:
        if marked:
            problems.append("step 3 has a local marker on nodes %s" % marked)
        if node not in s3:
            problems.append("no step 3 directory on node %d (the dying rank's)" % node)
        elif point != "local_create" and "w%d.bin" % rank not in s3[node]:
            problems.append("node %d has no w%d.bin of step 3: %s" % (node, rank, s3[node]))
    elif point in ("before_local_marker", "mid_marker"):
        if node in marked:
            problems.append("node %d of the dying rank has step 3's local marker" % node)
        if point == "mid_marker" and "commit.json.tmp" not in s3.get(node, set()):
            problems.append("node %d has no commit.json.tmp of step 3: %s" % (node, s3.get(node)))
    else:  # the drain: committed in the local tier, not in the shared root
        if marked != list(range(nodes)):
            problems.append("step 3's local marker on nodes %s, expected all %d" % (marked, nodes))
        if "commit.json" in on_disk(root).get(3, set()):
            problems.append("step 3 committed in the shared root although the drain died")
    if point not in ("mid_marker", "before_marker") and "commit.json.tmp" in on_disk(root).get(3, set()):
        problems.append("the shared root has a marker temp file of step 3")
    return problems


def flip_local_byte(base, nodes, step, writer=0, offset=4097):
    """Flips one byte of every copy of writer `writer`'s file of `step`."""
    flipped = 0
    for n in range(nodes):
        path = os.path.join(base, "node%d" % n, "step_%010d" % step, "w%d.bin" % writer)
        if os.path.exists(path):
            with open(path, "r+b") as f:
                f.seek(offset)
                b = f.read(1)
                f.seek(offset)
                f.write(bytes([b[0] ^ 0x10]))
            flipped += 1
    return flipped


def run_local_phases(args):
    runner = Runner(args)
    failures = []
    cases = 0

    def fail(case, problems, output=""):
        if problems:
            failures.append((case, problems))
            print("FAIL %s:\n  %s" % (case, "\n  ".join(problems)))
            if output:
                tail = output.splitlines()[-40:]
                print("  --- output ---\n" + "\n".join("  | " + line for line in tail))
        else:
            print("ok   %s" % case)

    for np in [int(n) for n in args.np.split(",")]:
        rpn = LOCAL_RPN[np]
        nodes = (np + rpn - 1) // rpn
        check_np, check_rpn = LOCAL_CHECK[np]
        check_nodes = (check_np + check_rpn - 1) // check_rpn
        base = os.path.join(args.work, "local_np%d" % np)
        shutil.rmtree(base, ignore_errors=True)
        template = os.path.join(base, "template")

        def tier_args(case_dir, k=rpn):
            return ["--local-dir", os.path.join(case_dir, "local"), "--ranks-per-node", k]

        def check(case_dir, at_np=check_np, at_rpn=check_rpn):
            return runner.check(at_np, os.path.join(case_dir, "ckpt"),
                                extra=tier_args(case_dir, at_rpn))

        # Job A: step 1 in both tiers, step 2 in the local tier only.
        rc, out = runner.run(np, "save", os.path.join(template, "ckpt"), 1, 2,
                             "--persistent-every", 2, *tier_args(template))
        if rc != 0:
            fail("local np%d job A (steps 1, 2)" % np, ["exited %s" % rc], out)
            continue
        where = "%d nodes of %d rank(s), check at np%d on %d node(s)" % (
            nodes, rpn, check_np, check_nodes)

        # The controls and the fault cases, in order, are one list dealt out
        # by --share.
        share, shares = args.share
        item = iter(range(1 << 30))
        stale_control = np == 3  # needs a node that alone cannot restore step 2

        def mine():
            return next(item) % shares == share

        if not args.no_controls and mine():
            # No fault: step 3 in both tiers; local retention keeps 2 and 3.
            cases += 1
            d = os.path.join(base, "control-nofault")
            fresh_copy(template, d)
            rc, out = runner.run(np, "save", os.path.join(d, "ckpt"), 3, 3, "--tier", "persistent",
                                 *tier_args(d))
            problems = [] if rc == 0 else ["job B without a fault exited %s" % rc]
            want = ([1, 2, 3], {"1": "persistent", "2": "local", "3": "both"})
            oracle = local_oracle(os.path.join(d, "ckpt"), os.path.join(d, "local"), check_nodes)
            if oracle != want:
                problems.append("the files say %s, expected %s" % (oracle, want))
            crc, report, cout = check(d)
            problems += expect_local_check(crc, report, *want)
            fail("local np%d control: no fault, step 3 in both tiers (%s)" % (np, where),
                 problems, out + cout)

        if not args.no_controls and mine():
            # The comparison catches a flipped byte in every copy of a local file.
            cases += 1
            d = os.path.join(base, "control-flipped")
            fresh_copy(template, d)
            flipped = flip_local_byte(os.path.join(d, "local"), nodes, 2)
            crc, report, cout = check(d)
            problems = [] if flipped >= 2 else ["%d copies of w0.bin of step 2, expected 2" % flipped]
            if crc == 0 or report is None or "2" not in report["failed"]:
                problems.append("a flipped byte in local step 2 was not caught (rc %s)" % crc)
            elif "checksum mismatch" not in report["failed"]["2"]:
                problems.append("step 2 failed for another reason: %s" % report["failed"]["2"])
            if not expect_local_check(crc, report, [1, 2], {"1": "both", "2": "local"}):
                problems.append("expect_local_check accepted a damaged step")
            fail("local np%d control: a flipped byte in every copy is caught" % np, problems, cout)

        if not args.no_controls and mine():
            # A node lost (its dir wiped; a replacement joins with an empty
            # one): every step restores from the copies on the other nodes.
            cases += 1
            d = os.path.join(base, "control-node-lost")
            fresh_copy(template, d)
            shutil.rmtree(os.path.join(d, "local", "node%d" % (nodes - 1)))
            want = ([1, 2], {"1": "both", "2": "local"})
            problems = []
            oracle = local_oracle(os.path.join(d, "ckpt"), os.path.join(d, "local"), nodes)
            if oracle != want:
                problems.append("the files say %s, expected %s" % (oracle, want))
            crc, report, cout = check(d, np, rpn)
            problems += expect_local_check(crc, report, *want)
            fail("local np%d control: node %d lost, replaced, restored from copies"
                 % (np, nodes - 1), problems, cout)

        if not args.no_controls and mine():
            # Both nodes of a partner pair lost: step 2 is gone from the
            # local tier, and the job falls back to the shared root's step 1.
            cases += 1
            d = os.path.join(base, "control-pair-lost")
            fresh_copy(template, d)
            for n in (0, 1):
                shutil.rmtree(os.path.join(d, "local", "node%d" % n))
            want = ([1], {"1": "persistent"})
            problems = []
            oracle = local_oracle(os.path.join(d, "ckpt"), os.path.join(d, "local"), nodes)
            if oracle != want:
                problems.append("the files say %s, expected %s" % (oracle, want))
            crc, report, cout = check(d, np, rpn)
            problems += expect_local_check(crc, report, *want)
            fail("local np%d control: nodes 0 and 1 (a partner pair) lost, falls back to the "
                 "shared root" % np, problems, cout)

        if stale_control and not args.no_controls and mine():
            # Job B on node 0 alone cannot restore step 2 (node 0 lacks rank
            # 1's boxes), so it removes its copy and saves step 2 again, at 1
            # rank; nodes 1 and 2 keep job A's save. A job on all 3 nodes must
            # restore B's, the newest, and nodes 1 and 2 drop A's.
            cases += 1
            d = os.path.join(base, "control-stale-save")
            fresh_copy(template, d)
            rc, out = runner.run(1, "save", os.path.join(d, "ckpt"), 2, 2, "--tier", "local",
                                 *tier_args(d, 1))
            problems = [] if rc == 0 else ["job B (node 0, step 2 again) exited %s" % rc]
            # (Step 1 stays whole on nodes 1 and 2.)
            want = ([1, 2], {"1": "both", "2": "local"})
            oracle = local_oracle(os.path.join(d, "ckpt"), os.path.join(d, "local"), nodes)
            if oracle != want:
                problems.append("the files say %s, expected %s" % (oracle, want))
            crc, report, cout = check(d, np, rpn)
            problems += expect_local_check(crc, report, *want)
            if report is not None and report.get("world_size_at_save", {}).get("2") != 1:
                problems.append("step 2 is not job B's save (at 1 rank): world sizes %s"
                                % report.get("world_size_at_save"))
            left = local_steps_on_disk(os.path.join(d, "local"), nodes).get(2, {})
            if sorted(left) != [0]:
                problems.append("step 2 left on nodes %s after the check, expected [0]" % sorted(left))
            fail("local np%d control: a stale save of step 2 on nodes outside a job; the newest "
                 "save wins" % np, problems, out + cout)

        for case_point, action in ((p, a) for p in LOCAL_POINTS for a in ACTIONS):
            if not mine():
                continue
            name, point, tier, fixed = case_point
            cases += 1
            if fixed == "leader":  # node 0's or the last node's lowest rank
                rank = 0 if action == "exit" else (nodes - 1) * rpn
            elif fixed is not None:
                rank = fixed
            else:
                rank = 0 if action == "exit" else np - 1
            case = "local np%d %s %s rank %d (%s)" % (np, name, action, rank, where)
            d = os.path.join(base, "%s-%s" % (name.replace(" ", "_"), action))
            fresh_copy(template, d)
            root, lbase = os.path.join(d, "ckpt"), os.path.join(d, "local")
            fault = "rank=%d,point=%s,action=%s,step=3" % (rank, point, action)
            if point == "mid_write":
                fault += ",after_bytes=65536"
            rc, out = runner.run(np, "save", root, 3, 3, "--tier", tier, *tier_args(d), fault=fault)
            problems = []
            if rc is None:
                problems.append("job B hung")
            elif rc == 0:
                problems.append("job B succeeded although rank %d should have died" % rank)
            word = "exit" if action == "exit" else "SIGKILL"
            if "injected %s at %s on rank %d" % (word, point, rank) not in out:
                problems.append("the fault did not fire")
            problems += local_debris(point, np, rpn, rank, root, lbase)
            want = local_oracle(root, lbase, check_nodes)
            # What the case itself promises, beside the files' verdict.
            # The save of step 3 recycles the oldest local step (1) when it starts,
            # so step 1 may be left in the shared root only (in the local tier too
            # if a node's lowest rank died before recycling its copy).
            if point in PRE_COMMIT and not (want[0] == [1, 2] and want[1].get("2") == "local"
                                            and want[1].get("1") in ("both", "persistent")):
                problems.append("step 3 died before its local commit, yet the files say %s"
                                % (want,))
            if tier == "persistent" and want != ([1, 2, 3], {"1": "persistent", "2": "local",
                                                             "3": "local"}):
                problems.append("step 3 committed in the local tier before the drain died, yet "
                                "the files say %s" % (want,))
            if want[0][:2] != [1, 2]:
                problems.append("steps 1 and 2 should survive: the files say %s" % (want,))
            crc, report, cout = check(d)
            problems += expect_local_check(crc, report, *want)
            if report is not None and not problems:
                case += ": newest step %d (%s)" % (want[0][-1], want[1][str(want[0][-1])])
            fail(case, problems, out + cout)

    print("\nlocal: %d cases, %d failed, %d hung jobs" % (cases, len(failures), runner.hangs))
    return 1 if failures or runner.hangs else 0


# ---------------------------------------------------------------------------
# Randomized kills

def wait_for_pids(pid_dir, np, job, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if job.proc.poll() is not None:
            return None
        pids = {}
        for r in range(np):
            try:
                with open(os.path.join(pid_dir, "rank%d" % r)) as f:
                    pids[r] = int(f.read().strip())
            except (OSError, ValueError):
                break
        if len(pids) == np:
            return pids
        time.sleep(0.02)
    return None


def run_random(args):
    rng = random.Random(args.seed)
    print("random kills: seed %d, %d trials, delay %.1f-%.1f s, rows %d"
          % (args.seed, args.trials, args.min_delay, args.max_delay, args.rows))
    runner = Runner(args)
    work = os.path.join(args.work, "random")
    shutil.rmtree(work, ignore_errors=True)
    root = os.path.join(work, "ckpt0")
    pid_dir = os.path.join(work, "pids")  # crash_job writes DIR/../pids/rank<R>
    rows = str(args.rows)

    stats = dict(trials=0, kills=0, kills_all_ranks=0, steps_committed=0, acknowledged=0,
                 broken=0, lost=0, restores_verified=0, uncommitted_cleaned=0,
                 marker_tmp_seen=0, hangs=0, errors=0, roots=0, max_exit_after_kill_s=0.0)
    if args.local:
        stats.update(wrong_listing=0, acknowledged_all=0, acknowledged_persistent=0,
                     newest_checked=0, stale_saves_seen=0)
    base = os.path.join(work, "local0")  # --local: BASE/node<N> per simulated node

    def local_args(np):
        if not args.local:
            return []
        return ["--local-dir", base, "--ranks-per-node", str(LOCAL_RPN.get(np, 1)),
                "--persistent-every", str(args.persistent_every)]
    seen = set()       # steps ever seen committed by a check
    acked = set()      # steps the job was told were committed
    lost = set()
    verified = set()
    broken = set()

    def nodes_of(np):
        return -(-np // LOCAL_RPN.get(np, 1))

    def record_check(np, steps, loop_np=None, newest_acked=None):
        # Restore and Verify take ~10-20 ms a step at 4 ranks on 2 busy cores.
        timeout = JOB_TIMEOUT + 0.1 * (len(seen) + 1000)
        if args.local:
            # What the files predict for a job on the check's nodes.
            want = local_oracle(root, base, nodes_of(np))
            # Steps of which nodes hold different saves (a job on fewer nodes
            # saved the step number again): the newest save must win.
            stats["stale_saves_seen"] += len(local_conflicts(base, nodes_of(np)))
        rc, report, out = runner.check(np, root, steps=steps, rows=rows, timeout=timeout,
                                       extra=local_args(np))
        if report is None:
            stats["errors"] += 1
            print("  check at np%d printed no report (rc %s):\n%s" % (np, rc, out[-3000:]))
            return
        committed = report["committed"]
        for e in report["before_open"]:
            if not e["committed"]:
                stats["uncommitted_cleaned"] += 1
                stats["marker_tmp_seen"] += e["marker_tmp"]
        now = set(committed)
        if not args.local:
            newly_lost = (seen | acked) - now - lost
            # Steps are saved in order from latest+1: a gap is a lost step too.
            if committed:
                newly_lost |= set(range(1, committed[-1] + 1)) - now - lost
        else:
            # Local steps come and go (local retention keeps 2; a check on
            # fewer nodes may not see them): the shared root's steps must
            # stay (retention is off), and the newest step acknowledged to the
            # loop must be listed by a check on its nodes or more.
            if (committed, report.get("tiers")) != want:
                stats["wrong_listing"] += 1
                print("  LISTING at np%d: %s with tiers %s; the files predict %s"
                      % (np, committed, report.get("tiers"), want))
            persistent = {int(k) for k, t in report.get("tiers", {}).items() if t != "local"}
            newly_lost = (seen | acked) - now - lost
            if newest_acked is not None and nodes_of(np) >= nodes_of(loop_np):
                if newest_acked in now:
                    stats["newest_checked"] += 1
                else:
                    newly_lost.add(newest_acked)
            committed_in_root = sorted(persistent)
        if newly_lost:
            print("  LOST steps %s (committed now: %s)" % (sorted(newly_lost), committed))
            lost.update(newly_lost)
        for s, why in report["failed"].items():
            print("  BROKEN step %s: %s" % (s, why))
            broken.add(int(s))
        root_steps = committed_in_root if args.local else committed
        if report["dirs_after_open"] != root_steps:
            stats["errors"] += 1
            print("  directories after Open %s, committed %s"
                  % (report["dirs_after_open"], root_steps))
        if rc != 0 and not report["failed"]:
            stats["errors"] += 1
            print("  check exited %s:\n%s" % (rc, out[-3000:]))
        seen.update(committed_in_root if args.local else now)
        verified.update(report["checked_ok"])
        stats["restores_verified"] += len(report["checked_ok"])

    def rotate():
        """A full check of the root, then a fresh one (bounds disk and check time)."""
        nonlocal root, base
        record_check(rng.choice([1, 2, 3, 4]), "all")
        stats["steps_committed"] += len(seen)
        stats["acknowledged"] += len(acked)
        stats["broken"] += len(broken)
        stats["lost"] += len(lost)
        for s in (seen, acked, lost, verified, broken):
            s.clear()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
        stats["roots"] += 1
        root = os.path.join(work, "ckpt%d" % stats["roots"])
        base = os.path.join(work, "local%d" % stats["roots"])

    for trial in range(1, args.trials + 1):
        np = rng.choice([2, 3, 4])
        check_np = rng.choice([n for n in (1, 2, 3, 4) if n != np])
        delay = rng.uniform(args.min_delay, args.max_delay)
        kill_all = rng.random() < args.all_ranks_fraction
        # Short runs too kill every rank at once at least once: the last trial
        # does if no earlier one did.
        kill_all = kill_all or (trial == args.trials > 1 and stats["kills_all_ranks"] == 0)
        shutil.rmtree(pid_dir, ignore_errors=True)
        job = runner.start(np, "loop", root, "--rows", rows, *local_args(np))
        pids = wait_for_pids(pid_dir, np, job)
        victims, exit_after_kill, newest_acked = [], 0.0, None
        if pids is None:
            stats["errors"] += 1
            rc, out = runner.finish(job, timeout=5)
            print("trial %d: the loop at np%d never started (rc %s):\n%s"
                  % (trial, np, rc, out[-3000:]))
        else:
            time.sleep(delay)
            victims = sorted(pids) if kill_all else [rng.randrange(np)]
            for r in victims:
                try:
                    os.kill(pids[r], signal.SIGKILL)
                    stats["kills"] += 1
                except ProcessLookupError:
                    stats["errors"] += 1
                    print("trial %d: rank %d (pid %d) was already gone" % (trial, r, pids[r]))
            stats["kills_all_ranks"] += kill_all
            killed_at = time.time()
            rc, out = runner.finish(job)
            exit_after_kill = time.time() - killed_at
            stats["max_exit_after_kill_s"] = round(max(stats["max_exit_after_kill_s"],
                                                       exit_after_kill), 2)
            if rc is None:
                print("trial %d: mpirun did not exit within %d s of the kill: HANG"
                      % (trial, JOB_TIMEOUT))
            elif rc == 0:
                stats["errors"] += 1
                print("trial %d: the loop exited 0 after a SIGKILL" % trial)
            k = 0
            for line in out.splitlines():
                if line.startswith("committed "):
                    step = int(line.split()[1])
                    newest_acked = step
                    # --local: save k of a loop job goes to the shared root
                    # if k % persistent_every == 0; the others may go.
                    if not args.local or k % args.persistent_every == 0:
                        acked.add(step)
                    if args.local:
                        stats["acknowledged_all"] += 1
                        stats["acknowledged_persistent"] += k % args.persistent_every == 0
                    k += 1
        stats["trials"] += 1
        # Restore every step not verified yet, the newest, and a few old ones.
        old = sorted(verified)
        sample = rng.sample(old, min(3, len(old)))
        first_new = max(verified) + 1 if verified else 1
        steps = ",".join(str(s) for s in sample + ["%d-" % first_new])
        before = len(seen)
        record_check(check_np, steps, np, newest_acked)
        print("trial %3d: loop np%d, killed rank %s after %.2f s, exit %.2f s later, check np%d: "
              "%d new steps, %d committed in root %d"
              % (trial, np, "all" if kill_all else victims, delay, exit_after_kill, check_np,
                 len(seen) - before, len(seen), stats["roots"]))
        sys.stdout.flush()
        if (trial % args.fresh_root_every == 0 or len(seen) >= args.max_steps_per_root
                or trial == args.trials):
            rotate()

    stats["hangs"] = runner.hangs
    print("\nRANDOM-KILLS " + json.dumps(stats, sort_keys=True))
    if args.local:
        print("two tiers: listings that differ from the files' prediction %(wrong_listing)d, "
              "steps acknowledged to the job %(acknowledged_all)d (of them in the shared root "
              "%(acknowledged_persistent)d), newest acknowledged step listed by a check on the "
              "same or more nodes %(newest_checked)d times, steps of which the check's nodes "
              "held different saves %(stale_saves_seen)d" % stats)
    print("trials %(trials)d, kills %(kills)d (all ranks at once: %(kills_all_ranks)d), "
          "steps committed %(steps_committed)d (acknowledged to the job: %(acknowledged)d), "
          "broken commits %(broken)d, earlier steps lost %(lost)d, restores verified "
          "%(restores_verified)d, uncommitted steps cleaned by Open %(uncommitted_cleaned)d "
          "(with commit.json.tmp: %(marker_tmp_seen)d), hangs %(hangs)d, errors %(errors)d, "
          "roots %(roots)d, slowest job exit after a kill %(max_exit_after_kill_s).2f s" % stats)
    bad = stats["broken"] or stats["lost"] or stats["hangs"] or stats["errors"]
    return 1 if bad else 0


def share_arg(text):
    i, n = (int(x) for x in text.split("/"))
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError("want I/N with 0 <= I < N: %s" % text)
    return i, n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["phases", "local", "random"])
    ap.add_argument("--job", required=True, help="the crash_job binary")
    ap.add_argument("--work", required=True, help="a scratch directory (wiped)")
    ap.add_argument("--mpiexec", default="mpiexec --oversubscribe --mca mpi_yield_when_idle 1",
                    help="launcher and its flags, without the process count")
    ap.add_argument("--np-flag", default="-n")
    ap.add_argument("--ranks-per-file", type=int, default=0,
                    help="every job saves with a subfile per this many ranks (Options::files)")
    ap.add_argument("--np", default="2,3,4", help="phases: world sizes of the crashing jobs")
    ap.add_argument("--no-controls", action="store_true", help="phases: skip the damage controls")
    ap.add_argument("--share", type=share_arg, default=(0, 1), metavar="I/N",
                    help="phases: of the point x action cases (in order), only those k with "
                         "k %% N == I at every world size (default 0/1: all). ctest's default "
                         "suite deals the cases out over np 2, 3, 4 (0/3, 1/3, 2/3)")
    ap.add_argument("--trials", type=int, default=20, help="random: trials")
    ap.add_argument("--seed", type=int, default=None, help="random: seed (default: from time)")
    ap.add_argument("--min-delay", type=float, default=0.3)
    ap.add_argument("--max-delay", type=float, default=3.0)
    ap.add_argument("--all-ranks-fraction", type=float, default=0.15,
                    help="random: share of trials that SIGKILL every rank at once")
    ap.add_argument("--rows", type=int, default=1024,
                    help="random: rows of params/w (1 KiB each; the state is ~1.2 KiB per row)")
    ap.add_argument("--fresh-root-every", type=int, default=25,
                    help="random: after N trials, restore every committed step, then start a "
                         "fresh root")
    ap.add_argument("--max-steps-per-root", type=int, default=600,
                    help="random: also start a fresh root once this many steps are committed")
    ap.add_argument("--local", action="store_true",
                    help="random: the loop saves with the local tier (nodes simulated as in "
                         "mode local); see run_random")
    ap.add_argument("--persistent-every", type=int, default=3,
                    help="random --local: Options::persistent_every of the loop")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int(time.time() * 1000) % 1000000007
    os.makedirs(args.work, exist_ok=True)
    sys.exit({"phases": run_phases, "local": run_local_phases, "random": run_random}[args.mode](args))


if __name__ == "__main__":
    main()
