#!/usr/bin/env python3
"""`python -m mhckpt convert` of an Orbax and a DCP checkpoint, against a cold
`dd` read plus a direct `dd` write of the same bytes, measured in the same run.

    python/.venv/bin/python bench/peers/convert_bench.py --mib 1024 --nps 1 2 --reps 3 \\
        --dir /var/tmp/convert-bench --json convert.json

The checkpoint is the benchmark model (bench/peers/model.py) at --mib, saved
once by the real library in a process of its own: Orbax through
`ocp.CheckpointManager(...).save(0, args=StandardSave(tree))` (jax CPU arrays,
Orbax's defaults: OCDBT, TensorStore), DCP through
`torch.distributed.checkpoint.save(state_dict, checkpoint_id=..., no_dist=True)`
(FileSystemWriter). The checkpoint lives on the file system of --dir (a disk,
not tmpfs: the page cache is dropped before each timed read).

Each rep, for each format, in this order:
  dd      the checkpoint's files read cold (`dd bs=16M of=/dev/null`, one after
          the other, the page cache dropped first), then the same files written
          back, now from the page cache, with `dd bs=16M oflag=direct
          conv=fsync` into new files on the same file system (the dd
          "convert": a cold read plus a direct write of the same bytes);
  np=N    for each N of --nps: the page cache dropped, then the code warmed
          (one `python -c "import mhckpt, <the reader's library>"`, untimed:
          the checkpoint's bytes stay cold, the interpreter's files do not),
          then `mpirun -np N python -m mhckpt convert SRC DST` timed from start
          to exit (interpreter start, imports, reading, the mhckpt save and its
          commit), DST removed afterwards.
One untimed convert per N comes first. The record holds every sample and the
medians, with parts of each convert: imports_s (the untimed import above,
timed: the interpreter's files cold, as it runs right after the drop),
snapshot_s and write_s (from mhckpt's log line of the save); ratio = median(dd read + dd write) / median(convert): the convert's
speed as a fraction of dd's (the target is >= 0.5). Needs root (to drop the
page cache); without it the reads are not cold and the record says so.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import model  # noqa: E402

MPIRUN_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
                "--mca", "btl_vader_single_copy_mechanism", "none"]
LIBRARY = {"orbax": "orbax.checkpoint", "dcp": "torch.distributed.checkpoint"}


# ------------------------------------------------------------- the sources


def make_orbax(path: str, mib: int) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import orbax.checkpoint as ocp

    jax.config.update("jax_enable_x64", True)  # the int64 step array; jax narrows it to int32 otherwise
    arrays = model.build_local(mib, 1, 0)
    tree = model.nest({k: jax.numpy.asarray(v) for k, v in arrays.items()})
    del arrays
    with ocp.CheckpointManager(path) as mngr:
        mngr.save(0, args=ocp.args.StandardSave(tree))
        mngr.wait_until_finished()


def make_dcp(path: str, mib: int) -> None:
    import numpy as np
    import torch
    import torch.distributed.checkpoint as dcp

    def to_torch(a):
        name = "bfloat16" if a.dtype.name == "bfloat16" else None
        if name:
            return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    sd = model.nest({k: to_torch(v) for k, v in model.build_local(mib, 1, 0).items()})
    dcp.save(sd, checkpoint_id=path, no_dist=True)


# ------------------------------------------------------------- the driver


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "OPAL_", "PRTE_"))}
    e["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    e.setdefault("JAX_PLATFORMS", "cpu")
    if os.geteuid() == 0:
        e["OMPI_ALLOW_RUN_AS_ROOT"] = e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return e


def drop_caches(cold: bool) -> None:
    if cold:
        model.drop_caches()
    else:
        os.sync()


def files_of(root: str) -> list:
    out = []
    for d, _, fs in os.walk(root):
        out.extend(os.path.join(d, f) for f in fs)
    return sorted(out)


def timed(cmd, **kw) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), **kw)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({p.returncode}):\n{p.stdout[-3000:]}")
    timed.last_output = p.stdout
    return dt


def dd_pair(src: str, scratch: str, cold: bool):
    """(cold read, direct write) seconds of the files of src."""
    files = files_of(src)
    drop_caches(cold)
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    read = time.perf_counter() - t0
    os.makedirs(scratch)
    t0 = time.perf_counter()
    for i, f in enumerate(files):
        subprocess.run(["dd", f"if={f}", f"of={os.path.join(scratch, str(i))}", "bs=16M", "oflag=direct",
                        "conv=fsync", "status=none"], check=True)
    write = time.perf_counter() - t0
    shutil.rmtree(scratch)
    return read, write


def convert(py: str, fmt: str, src: str, dst: str, np_: int, cold: bool, want_bytes: int) -> dict:
    """The convert's wall time, the untimed import's (warm, one process),
    and the save's snapshot and write seconds from mhckpt's log line."""
    shutil.rmtree(dst, ignore_errors=True)
    drop_caches(cold)
    imports = timed([py, "-c", f"import mhckpt, mpi4py.MPI, {LIBRARY[fmt]}"], cwd="/")
    dt = timed(["mpirun", "-np", str(np_), *MPIRUN_FLAGS, py, "-m", "mhckpt", "convert", "--from", fmt, src, dst],
               cwd="/")
    out = timed.last_output
    m = re.search(r"(\d+) bytes", out)
    if not m or int(m.group(1)) != want_bytes:
        raise RuntimeError(f"convert wrote {m and m.group(1)} bytes, not {want_bytes}:\n{out}")
    shutil.rmtree(dst)
    phase = {k: float(v) for k, v in re.findall(r"\b(snapshot|write) ([\d.]+)", out)}
    return {"convert_s": dt, "imports_s": imports, "snapshot_s": phase.get("snapshot"), "write_s": phase.get("write")}


def version() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--nps", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--formats", nargs="+", default=["orbax", "dcp"], choices=["orbax", "dcp"])
    p.add_argument("--dir", required=True, help="scratch directory on the file system to measure (not tmpfs)")
    p.add_argument("--json")
    p.add_argument("--make", choices=["orbax", "dcp"], help=argparse.SUPPRESS)  # internal: make a source
    a = p.parse_args()
    if a.make:
        (make_orbax if a.make == "orbax" else make_dcp)(a.dir, a.mib)
        return
    py = sys.executable
    cold = os.geteuid() == 0
    if not cold:
        print("convert_bench: not root: the page cache is NOT dropped, reads are not cold", file=sys.stderr)
    want = model.global_bytes(a.mib, 1)
    records = []
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    try:
        for fmt in a.formats:
            src, dst, scratch = (os.path.join(a.dir, n) for n in ("src", "dst", "dd"))
            t0 = time.perf_counter()
            subprocess.run([py, os.path.abspath(__file__), "--make", fmt, "--mib", str(a.mib), "--dir", src],
                           check=True, env=env(), cwd="/")
            src_bytes = sum(os.path.getsize(f) for f in files_of(src))
            print(f"convert_bench: {fmt}: {len(files_of(src))} files, {src_bytes / 2**20:.1f} MiB on disk "
                  f"({want / 2**20:.1f} MiB of arrays), made in {time.perf_counter() - t0:.1f} s", flush=True)
            for np_ in a.nps:  # the untimed warm-up
                convert(py, fmt, src, dst, np_, cold, want)
            samples = {"dd_read_s": [], "dd_write_s": []}
            runs = {n: [] for n in a.nps}
            for rep in range(a.reps):
                r, w = dd_pair(src, scratch, cold)
                samples["dd_read_s"].append(r)
                samples["dd_write_s"].append(w)
                line = f"  rep {rep}: dd read {r:.2f} s + write {w:.2f} s"
                for np_ in a.nps:
                    c = convert(py, fmt, src, dst, np_, cold, want)
                    runs[np_].append(c)
                    line += f"  convert np={np_} {c['convert_s']:.2f} s (snapshot {c['snapshot_s']:.2f} s)"
                print(line, flush=True)
            shutil.rmtree(src)
            dd = statistics.median(r + w for r, w in zip(samples["dd_read_s"], samples["dd_write_s"]))
            rec = {"system": f"convert-{fmt}", "version": version(), "mib": a.mib, "global_bytes": want,
                   "source_bytes": src_bytes, "reps": a.reps, "cold_read": cold, "dd_s": dd,
                   "dd_read_s": statistics.median(samples["dd_read_s"]),
                   "dd_write_s": statistics.median(samples["dd_write_s"]), "convert": {}}
            for np_ in a.nps:
                med = {k: statistics.median(c[k] for c in runs[np_]) for k in runs[np_][0]}
                rec["convert"][str(np_)] = dict(med, ratio=dd / med["convert_s"])
                samples[f"convert_np{np_}"] = runs[np_]
                print(f"convert_bench: {fmt} np={np_}: convert {med['convert_s']:.2f} s, dd read+write {dd:.2f} s "
                      f"(read {rec['dd_read_s']:.2f} + write {rec['dd_write_s']:.2f}): ratio "
                      f"{dd / med['convert_s']:.2f}; beside it: cold imports {med['imports_s']:.2f} s (one process); "
                      f"of it: snapshot {med['snapshot_s']:.2f} s, write {med['write_s']:.2f} s", flush=True)
            rec["samples"] = samples
            records.append(rec)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
