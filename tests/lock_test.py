#!/usr/bin/python3
"""One job per root, with real jobs: two separate mpirun jobs on one root.

    lock_test.py --job BIN --work DIR --mpiexec "mpiexec --oversubscribe ..." [--np-flag -n]

live holder: job A (2 ranks) commits step 1 and is held mid-write of step 2
  (MHCKPT_FAULT action=wait on rank 0). Job B (3 ranks) opens the same root:
  it must fail with FAILED_PRECONDITION naming A's host and rank-0 pid, and
  A's in-progress step 2 must still be on disk. Released, A must commit
  step 2 and restore it bit-exactly; its lease must be gone when it ends.
crashed holder: job A' commits step 3 and is held mid-write of step 4; its
  rank 0 is SIGKILLed. Job C (3 ranks) must open the root (taking it over),
  remove the crashed step 4 and restore step 3 bit-exactly.

Exit status: 0 if every expectation held, 1 otherwise.
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

JOB_TIMEOUT = 60  # seconds


class Check:
    def __init__(self):
        self.failures = 0

    def __call__(self, ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            self.failures += 1


def step_dir(root, step):
    return os.path.join(root, "step_%010d" % step)


def start(args, np, *job_args, fault=None):
    cmd = shlex.split(args.mpiexec) + [args.np_flag, str(np), args.job] + list(job_args)
    env = dict(os.environ)
    env.pop("MHCKPT_FAULT", None)
    if fault:
        env["MHCKPT_FAULT"] = fault
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            text=True, start_new_session=True)


def finish(proc):
    """(exit status, output) of a started job; a job past JOB_TIMEOUT is killed (rc None)."""
    try:
        out, _ = proc.communicate(timeout=JOB_TIMEOUT)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def wait_for(path, proc):
    """True once `path` exists; False if `proc` ended first or JOB_TIMEOUT passed."""
    deadline = time.time() + JOB_TIMEOUT
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def held(args, root, step, gate):
    """Job `hold ROOT step`, stopped on rank 0 mid-write of step + 1 until `gate` exists."""
    fault = "rank=0,point=mid_write,action=wait,file=%s,step=%d,times=1" % (gate, step + 1)
    proc = start(args, 2, "hold", root, str(step), fault=fault)
    if not wait_for(gate + ".reached", proc):
        rc, out = finish(proc)
        raise SystemExit("job A never reached its gate (exit %s):\n%s" % (rc, out))
    with open(os.path.join(root, "mhckpt.lease")) as f:
        return proc, json.load(f)


def live_holder(args, root, check):
    gate = os.path.join(args.work, "gate_live")
    a, lease = held(args, root, 1, gate)
    check(lease["pid"] != os.getpid() and lease["host"] == socket.gethostname(),
          "the lease names A's rank 0: %s" % lease)
    check(os.path.isdir(step_dir(root, 2)), "A's step 2 is in progress on disk")
    b = start(args, 3, "open", root)
    rc_b, out_b = finish(b)
    print(out_b)
    want = "OPEN FAILED_PRECONDITION: checkpoint root '%s' is in use by another job (host '%s', pid %d" % (
        root, lease["host"], lease["pid"])
    check(rc_b == 3, "B exits 3 (root in use), got %s" % rc_b)
    check(want in out_b, "B's error names the holder: %r" % want)
    check("it holds the lock on mhckpt.lock" in out_b, "B's error says the lock is held")
    check(os.path.exists(os.path.join(step_dir(root, 2), "data.h5")),
          "A's in-progress step 2 survives B's Open")
    open(gate, "w").close()
    rc_a, out_a = finish(a)
    print(out_a)
    check(rc_a == 0 and "RESULT OK" in out_a, "A commits step 2 and restores it (exit %s)" % rc_a)
    check(os.path.exists(os.path.join(step_dir(root, 2), "commit.json")), "step 2 is committed")
    check(not os.path.exists(os.path.join(root, "mhckpt.lease")), "A removed its lease at exit")


def crashed_holder(args, root, check):
    gate = os.path.join(args.work, "gate_crash")
    a, lease = held(args, root, 3, gate)
    os.kill(lease["pid"], signal.SIGKILL)
    rc_a, out_a = finish(a)
    check(rc_a not in (0, None), "A' dies after its rank 0 is killed (exit %s)" % rc_a)
    check(os.path.isdir(step_dir(root, 4)) and
          not os.path.exists(os.path.join(step_dir(root, 4), "commit.json")),
          "the crashed step 4 is on disk, uncommitted")
    c = start(args, 3, "open", root)
    rc_c, out_c = finish(c)
    print(out_c)
    check(rc_c == 0 and "OPEN OK" in out_c and "RESULT OK" in out_c,
          "C takes the root over and restores step 3 (exit %s)" % rc_c)
    check("pid %d" % lease["pid"] in out_c and "took over" in out_c,
          "C says whose root it took over")
    check(not os.path.exists(step_dir(root, 4)), "C removed the crashed step 4")
    check(os.path.exists(os.path.join(step_dir(root, 3), "commit.json")), "step 3 is committed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", required=True, help="the lock_job binary")
    ap.add_argument("--work", required=True, help="a scratch directory (wiped)")
    ap.add_argument("--mpiexec", default="mpiexec --oversubscribe --mca mpi_yield_when_idle 1")
    ap.add_argument("--np-flag", default="-n")
    args = ap.parse_args()
    args.work = os.path.abspath(args.work)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    root = os.path.join(args.work, "root")
    check = Check()
    live_holder(args, root, check)
    crashed_holder(args, root, check)
    print("%d failure%s" % (check.failures, "" if check.failures == 1 else "s"))
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
