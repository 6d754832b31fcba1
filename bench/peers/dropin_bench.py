#!/usr/bin/env python3
"""What the Orbax and DCP drop-ins add to mhckpt's own Python API.

The same leaves -- each rank's row block of 8 float32 arrays as mhckpt.Shard,
MIB MiB in all -- saved through three front doors of the same core:

  plain         mhckpt.CheckpointManager(root).save(step, state); wait_until_finished()
  mhckpt.orbax  CheckpointManager(root).save(step, args=StandardSave(state)); wait_until_finished()
  mhckpt.torch  async_save(state, checkpoint_id=root/step_N).result()   (a directory per save, as DCP)

Each rep saves once through each of the three in turn (the first of a rep
rotating: plain, orbax, torch; orbax, torch, plain; ...), each: barrier,
save (the stall: until it returns), then until committed (the commit). The
figure of a save is the slowest rank's; the record holds the medians of
--reps timed reps after one untimed warm-up round, every sample, the page
faults of a stall (median; fresh staging memory shows there: one fault per
2 MiB page), and each drop-in against plain as the median of the ratios of
the same rep, with a distribution-free 95 % confidence interval.

    mpirun -np 2 python/.venv/bin/python bench/peers/dropin_bench.py --mib 256 --reps 9 \\
        --dir /var/tmp/dropin --json dropin.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import statistics
import time

import numpy as np
from mpi4py import MPI

import mhckpt
import mhckpt.orbax as ocp
import mhckpt.torch as mdcp

ARRAYS, COLS = 8, 4096


def make_state(mib: int, comm) -> dict:
    rows = max(comm.size, (mib << 20) // (ARRAYS * COLS * 4))
    base, extra = divmod(rows, comm.size)
    count = base + (1 if comm.rank < extra else 0)
    start = comm.rank * base + min(comm.rank, extra)
    rng = np.random.default_rng(comm.rank)
    return {f"w{i}": mhckpt.Shard(rng.standard_normal((count, COLS), dtype=np.float32), (start, 0), (rows, COLS))
            for i in range(ARRAYS)}


def median_ci95(xs):
    """A distribution-free 95 % confidence interval of the median of xs: the
    order statistics k and n + 1 - k, k the largest with
    P(Binomial(n, 1/2) < k) <= 2.5 %."""
    xs, n = sorted(xs), len(xs)
    k, below = 0, 0.0
    while k < n:
        below += math.comb(n, k) / 2 ** n  # P(B <= k)
        if below > 0.025:
            break
        k += 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def timed(comm, save, commit):
    """(stall, commit, page faults during the stall), each the slowest rank's."""
    comm.Barrier()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    handle = save()
    t1 = time.perf_counter()
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    commit(handle)
    t2 = time.perf_counter()
    return (comm.allreduce(t1 - t0, MPI.MAX), comm.allreduce(t2 - t0, MPI.MAX),
            comm.allreduce(f1 - f0, MPI.MAX))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", required=True)
    p.add_argument("--json")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    state = make_state(a.mib, comm)
    if comm.rank == 0:
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
    comm.Barrier()
    # The three interleaved save by save, so that a slow spell of the disk or
    # the machine hits all three alike.
    # Two steps kept by each: after every rep (no save timed meanwhile) the
    # older ones go through each API, then the machine settles, so that no
    # deletion in the background overlaps a timed save.
    plain = mhckpt.CheckpointManager(os.path.join(a.dir, "plain"))
    mngr = ocp.CheckpointManager(os.path.join(a.dir, "orbax"))

    def torch_dir(s):
        return os.path.join(a.dir, "torch", f"step_{s}")

    def drop(s):
        plain.delete(s)
        mngr.delete(s)
        if comm.rank == 0:
            shutil.rmtree(torch_dir(s), ignore_errors=True)
            os.sync()
        comm.Barrier()
        time.sleep(0.5)

    saves = {"plain": lambda s: timed(comm, lambda: plain.save(s, state), lambda _: plain.wait_until_finished()),
             "mhckpt.orbax": lambda s: timed(comm, lambda: mngr.save(s, args=ocp.args.StandardSave(state)),
                                             lambda _: mngr.wait_until_finished()),
             "mhckpt.torch": lambda s: timed(comm, lambda: mdcp.async_save(state, checkpoint_id=torch_dir(s)),
                                             lambda f: f.result())}
    names = list(saves)
    results = {k: [] for k in names}
    for s in range(a.reps + 1):
        # Each rep starts with the next one (a save follows each of the
        # others equally often).
        for k in names[s % 3:] + names[:s % 3]:
            r = saves[k](s)
            if s > 0:  # save 0 is the warm-up
                results[k].append(r)
        if s >= 2:
            drop(s - 2)
    plain.close()
    mngr.close()

    try:
        version = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short=7",
                                  "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        version = "unknown"
    record = {"version": version, "mib": a.mib, "np": comm.size, "reps": a.reps, "systems": {}}
    for name, runs in results.items():
        stall = statistics.median(r[0] for r in runs)
        commit = statistics.median(r[1] for r in runs)
        record["systems"][name] = {"stall_s": stall, "commit_s": commit,
                                   "stall_page_faults": statistics.median(r[2] for r in runs),
                                   "samples": {"stall_s": [r[0] for r in runs], "commit_s": [r[1] for r in runs]}}
    # Paired: each drop-in's save against the plain save of the same rep (the
    # three ran back to back), so that a slow spell of the machine divides
    # out; the median of those ratios, with a distribution-free 95 %
    # confidence interval of that median (order statistics).
    for name, r in record["systems"].items():
        for what, i in (("stall", 0), ("commit", 1)):
            ratios = [x[i] / p[i] for x, p in zip(results[name], results["plain"])]
            lo, hi = median_ci95(ratios)
            r[f"{what}_vs_plain"] = statistics.median(ratios)
            r[f"{what}_vs_plain_ci95"] = [lo, hi]
    if comm.rank == 0:
        for name, r in record["systems"].items():
            print(f"{name:13s} stall {r['stall_s'] * 1e3:8.1f} ms ({r['stall_vs_plain']:.2f}x, "
                  f"95 % {r['stall_vs_plain_ci95'][0]:.2f}-{r['stall_vs_plain_ci95'][1]:.2f})  "
                  f"commit {r['commit_s'] * 1e3:8.1f} ms ({r['commit_vs_plain']:.2f}x, "
                  f"95 % {r['commit_vs_plain_ci95'][0]:.2f}-{r['commit_vs_plain_ci95'][1]:.2f})  "
                  f"page faults in the stall {r['stall_page_faults']:.0f}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
