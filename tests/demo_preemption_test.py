#!/usr/bin/python3
"""mhckpt-train-demo preempted: a SIGUSR1 to one rank only of a 2-rank run
(--preemption) stops every rank at the same step, which is saved, committed
and recorded as a preemption save; the run exits 0. Then

  - --resume at 3 ranks restores that step bit for bit and trains on;
  - an uninterrupted 2-rank run to the same step holds the same state, and
    resumed at 3 ranks ends with the same fingerprint as the preempted run;
  - --save-every 1 with --lazy commits every step, and --continuous saves
    whenever the previous save has finished, both without changing the
    training (the same final fingerprint as a run that saves only at the end).

    demo_preemption_test.py --demo BIN --dir DIR --mpiexec "mpiexec --oversubscribe ..."
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

FINGERPRINT = re.compile(r"^fingerprint step=(\d+) ([0-9a-f]{16})$", re.M)
PREEMPTED = re.compile(r"^preempted at step (\d+): saved in ([0-9.]+) s$", re.M)
RESTORED = re.compile(r"^restored step=(\d+) ", re.M)


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def command(mpiexec, ranks, demo, *args):
    return shlex.split(mpiexec) + ["-n", str(ranks), demo] + [str(a) for a in args]


def run(mpiexec, ranks, demo, *args):
    cmd = command(mpiexec, ranks, demo, *args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print("$ %s  -> %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    check(p.returncode == 0, "demo failed")
    return p.stdout


def rank_pid(directory, rank):
    """The pid of the demo process of `rank` that trains in `directory`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            if not argv[0].endswith(b"mhckpt-train-demo") or directory.encode() not in argv:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
            return int(pid)
    return None


def preempted_run(args, common):
    """2 ranks until rank 1 alone gets SIGUSR1; returns (step, its fingerprint, output)."""
    cmd = command(args.mpiexec, 2, args.demo, *common, "--steps", 1000000, "--save-every", 50,
                  "--lazy", "--preemption", "--grace", 30)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    signalled = None
    deadline = time.monotonic() + 120
    try:
        for line in p.stdout:
            out.append(line)
            # Once a save has committed, training is well under way.
            if signalled is None and line.startswith("saving step=50 "):
                pid = rank_pid(args.dir, 1)
                check(pid is not None, "the pid of rank 1")
                os.kill(pid, signal.SIGUSR1)
                signalled = time.monotonic()
            check(time.monotonic() < deadline, "the preempted run took too long")
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    text = "".join(out)
    print("$ %s  -> %s\n%s" % (" ".join(cmd), p.returncode, text))
    check(signalled is not None, "the run reached step 50")
    check(rc == 0, "the preempted run exits 0")
    check(time.monotonic() - signalled < 30, "the run exits within 30 s of the signal")
    found = PREEMPTED.findall(text)
    check(len(found) == 1, "one 'preempted at step' line")
    step = int(found[0][0])
    check(step > 50, "preempted after step 50, at %d" % step)
    committed = dict(FINGERPRINT.findall(text))
    check(str(step) in committed, "step %d committed" % step)
    check("step %d saved for preemption: " % step in text and "of a 30 s grace period" in text,
          "rank 0 logs the preemption save")
    return step, committed[str(step)], text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--mpiexec", required=True)
    args = parser.parse_args()
    root = args.dir
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    base = ["--model-mib", 0.5, "--log-every", 1000, "--lr", 0.002, "--max-to-keep", 0]

    # 1. Preempted through one rank only.
    args.dir = os.path.join(root, "preempted")
    step, fp_step, _ = preempted_run(args, ["--dir", args.dir] + base)
    with open(os.path.join(args.dir, "step_%010d" % step, "commit.json")) as f:
        record = json.load(f).get("preemption")
    check(record is not None and record["grace_ms"] == 30000 and 0 <= record["saved_after_ms"] < 30000,
          "step %d's marker records the preemption: %s" % (step, record))
    end = step + 20
    resumed = run(args.mpiexec, 3, args.demo, "--dir", args.dir, *base, "--steps", end,
                  "--save-every", 10, "--resume")
    check(RESTORED.findall(resumed) == [str(step)], "resumed from the preemption step")
    prints = FINGERPRINT.findall(resumed)
    check(prints[0] == (str(step), fp_step), "restored at 3 ranks bit for bit")
    final = dict(prints)[str(end)]

    # 2. Uninterrupted to the same step, then resumed at 3 ranks likewise.
    ref_dir = os.path.join(root, "reference")
    ref = run(args.mpiexec, 2, args.demo, "--dir", ref_dir, *base, "--steps", step,
              "--save-every", 50)
    check(dict(FINGERPRINT.findall(ref))[str(step)] == fp_step,
          "the uninterrupted run holds the same state at step %d" % step)
    ref_resumed = run(args.mpiexec, 3, args.demo, "--dir", ref_dir, *base, "--steps", end,
                      "--save-every", 10, "--resume")
    check(dict(FINGERPRINT.findall(ref_resumed))[str(end)] == final,
          "the same final fingerprint at step %d" % end)

    # 3. Saves every step (lazy), and continuous saves: the training unchanged.
    only_end = run(args.mpiexec, 2, args.demo, "--dir", os.path.join(root, "end"), *base,
                   "--steps", 12, "--save-every", 0)
    every = run(args.mpiexec, 2, args.demo, "--dir", os.path.join(root, "every"), *base,
                "--steps", 12, "--save-every", 1, "--lazy")
    continuous = run(args.mpiexec, 2, args.demo, "--dir", os.path.join(root, "continuous"), *base,
                     "--steps", 12, "--save-every", 0, "--continuous", "--lazy")
    want = dict(FINGERPRINT.findall(only_end))["12"]
    every_steps = [int(s) for s, _ in FINGERPRINT.findall(every)]
    check(every_steps == list(range(1, 13)), "--save-every 1 committed %s" % every_steps)
    check(dict(FINGERPRINT.findall(every))["12"] == want, "--save-every 1 --lazy: same training")
    continuous_steps = [int(s) for s, _ in FINGERPRINT.findall(continuous)]
    check(len(continuous_steps) >= 2 and continuous_steps[-1] == 12,
          "--continuous committed %s" % continuous_steps)
    check(dict(FINGERPRINT.findall(continuous))["12"] == want, "--continuous: same training")
    print("demo_preemption_test: preempted at step %d, resumed at 3 ranks to %d: %s, as "
          "uninterrupted; --continuous saved steps %s" % (step, end, final, continuous_steps))


if __name__ == "__main__":
    sys.exit(main())
