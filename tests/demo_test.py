#!/usr/bin/python3
"""A short run of mhckpt-train-demo: train at 2 ranks, resume at 3, then at 1
(--ranks A,B,C: at A, B, then C), and check that

  - every restore prints the fingerprint printed when that step committed,
  - the fingerprint printed for a committed step is the one numpy computes
    from its data.h5 (demo/fingerprint.h gives the formula),
  - training resumes where it stopped and the loss falls,
  - --max-to-keep holds,
  - a damaged newest step makes --resume fall back to the step before it.

    demo_test.py --demo BIN --dir DIR --mpiexec "mpiexec --oversubscribe ..."
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo"))
from fingerprint import file_fingerprint  # noqa: E402  (demo/fingerprint.py)

FINGERPRINT = re.compile(r"^fingerprint step=(\d+) ([0-9a-f]{16})$", re.M)
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)


def check(condition, what):
    if not condition:
        raise AssertionError(what)



def run(mpiexec, ranks, demo, *args):
    cmd = shlex.split(mpiexec) + ["-n", str(ranks), demo] + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    print("$ %s  -> %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    check(p.returncode == 0, "demo failed")
    return p.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--ranks", default="2,3,1", help="the world sizes of the three runs")
    args = parser.parse_args()
    n1, n2, n3 = (int(n) for n in args.ranks.split(","))
    shutil.rmtree(args.dir, ignore_errors=True)
    common = ["--dir", args.dir, "--model-mib", 0.5, "--save-every", 5, "--log-every", 5,
              "--max-to-keep", 3, "--lr", 0.002]

    first = run(args.mpiexec, n1, args.demo, *common, "--steps", 20)
    committed = dict(FINGERPRINT.findall(first))
    check(sorted(map(int, committed)) == [5, 10, 15, 20], "commits of run 1: %s" % committed)

    second = run(args.mpiexec, n2, args.demo, *common, "--steps", 30, "--resume")
    prints = FINGERPRINT.findall(second)
    check(prints[0] == ("20", committed["20"]),
          "restore at %d ranks printed %s, step 20 committed as %s" % (n2, prints[0], committed["20"]))
    check([int(s) for s, _ in LOSS.findall(second)] == [25, 30], "training resumed at step 21")
    committed.update(prints[1:])

    third = run(args.mpiexec, n3, args.demo, *common, "--steps", 30, "--resume")
    check(FINGERPRINT.findall(third) == [("30", committed["30"])], "restore at %d ranks" % n3)

    steps = sorted(int(d[5:]) for d in os.listdir(args.dir) if d.startswith("step_"))
    check(steps == [20, 25, 30], "--max-to-keep 3 left %s" % steps)
    for step in steps:
        computed = file_fingerprint(os.path.join(args.dir, "step_%010d" % step))
        check(computed == committed[str(step)],
              "step %d: data.h5 hashes to %s, the demo printed %s" % (step, computed, committed[str(step)]))

    losses = [float(l) for _, l in LOSS.findall(first)] + [float(l) for _, l in LOSS.findall(second)]
    check(losses[-1] < 0.6 * losses[0], "loss fell from %.4f to %.4f" % (losses[0], losses[-1]))

    # The newest step damaged (two flipped bytes of an array in its data.h5):
    # --resume falls back to step 25, bit for bit, and goes on.
    step_dir = os.path.join(args.dir, "step_%010d" % 30)
    with open(os.path.join(step_dir, "commit.json")) as f:
        weights = [a for a in json.load(f)["arrays"] if a["name"] == "model/layer0/w"]
    check(weights and weights[0].get("offset", -1) > 0, "step 30 places model/layer0/w")
    with open(os.path.join(step_dir, "data.h5"), "r+b") as f:
        for at in (weights[0]["offset"] + 3, weights[0]["offset"] + 11):
            f.seek(at)
            c = f.read(1)[0]
            f.seek(at)
            f.write(bytes([c ^ 0x41]))
    fourth = run(args.mpiexec, n1, args.demo, *common, "--steps", 35, "--resume")
    check(FINGERPRINT.findall(fourth)[0] == ("25", committed["25"]),
          "a damaged step 30 fell back to step 25: %s" % FINGERPRINT.findall(fourth)[:1])
    check("does not restore intact" in fourth and "step 30 is not saved" in fourth,
          "the fallback is said, and the damaged step is not saved again")
    check([int(s) for s, _ in FINGERPRINT.findall(fourth)][1:] == [35], "training went on to 35")
    print("demo_test: fingerprints match across %d, %d and %d ranks and the files; loss %.4f -> %.4f"
          % (n1, n2, n3, losses[0], losses[-1]))


if __name__ == "__main__":
    main()
