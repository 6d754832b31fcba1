#!/usr/bin/python3
"""A root that not every rank sees: node-local storage, for real.

    shared_root_test.py --demo BIN --work DIR --mpiexec "mpiexec ..." [--np N]

Every rank but rank 0 runs in a mount namespace of its own in which DIR/local
is a fresh tmpfs: as on a cluster whose job writes to /tmp on every node,
rank 0's root is not the directory the other ranks see at the same path.
Open must fail on every rank with FAILED_PRECONDITION naming the root and a
rank that does not see it — not hang in the first collective file call, as it
did before the check (`mhckpt-train-demo` then waited in its first save until
killed). Cases:

  missing: the root does not exist on the other ranks' "nodes";
  stale:   it does exist there (an old run's directory), without rank 0's lease;
  shared:  the control: without the private mounts the same job commits.

Exit status: 0 if every expectation held, 1 if one did not, 77 (skipped) if
this machine cannot make mount namespaces (not root, or no unshare).
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys

JOB_TIMEOUT = 60  # seconds: a hang is a failure

# Run by mpiexec for every rank: ranks >= 1 get a private tmpfs at $LOCAL.
WRAPPER = """#!/bin/bash
if [ "${OMPI_COMM_WORLD_RANK:-0}" != 0 ] && [ -n "$PRIVATE" ]; then
  exec unshare --mount --propagation private bash -c \\
    'mount -t tmpfs none "$LOCAL" && { [ -z "$STALE" ] || mkdir -p "$STALE"; } && exec "$@"' _ "$@"
fi
exec "$@"
"""


def can_unshare(probe_dir):
    """True if this process may make a mount namespace and mount a tmpfs in it
    (both, as the wrapper does)."""
    os.makedirs(probe_dir, exist_ok=True)
    try:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            'mount -t tmpfs none "$0"', probe_dir],
                           capture_output=True, timeout=10)
        return p.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run(args, wrapper, root, env):
    cmd = shlex.split(args.mpiexec) + ["-n", str(args.np), wrapper, args.demo, "--dir", root,
                                       "--steps", "4", "--save-every", "2", "--model-mib", "1"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=JOB_TIMEOUT,
                           env=dict(os.environ, **env))
    except subprocess.TimeoutExpired as e:
        out = e.stdout or b""
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out
    return p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, default=2)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    if not can_unshare(os.path.join(args.work, "probe")):
        print("skipped: cannot mount a tmpfs in a mount namespace here (unshare --mount)")
        return 77
    local = os.path.join(args.work, "local")
    os.makedirs(local)
    wrapper = os.path.join(args.work, "node_local.sh")
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    os.chmod(wrapper, 0o755)

    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        failures += 0 if ok else 1

    for case in ("missing", "stale"):
        root = os.path.join(local, case, "ckpt")
        env = {"PRIVATE": "1", "LOCAL": local, "STALE": root if case == "stale" else ""}
        rc, out = run(args, wrapper, root, env)
        print(out)
        check(rc is not None, f"{case}: the job ended (no hang) within {JOB_TIMEOUT} s")
        check(rc not in (None, 0), f"{case}: the job failed")
        want = ["FAILED_PRECONDITION", f"does not see the root '{root}' that rank 0 opened",
                "not node-local storage"]
        want.append("it does not exist here" if case == "missing" else "rank 0's lease is not there")
        for w in want:
            check(w in out, f"{case}: the error says {w!r}")
        committed = [d for d in os.listdir(root) if d.startswith("step_")] if os.path.isdir(root) else []
        check(not committed, f"{case}: rank 0's root holds no step ({committed})")

    root = os.path.join(local, "shared", "ckpt")
    rc, out = run(args, wrapper, root, {"PRIVATE": "", "LOCAL": local, "STALE": ""})
    print(out)
    check(rc == 0, "shared: the control job (no private mounts) succeeded")
    check(os.path.exists(os.path.join(root, "step_0000000004", "commit.json")),
          "shared: the control job committed step 4")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
