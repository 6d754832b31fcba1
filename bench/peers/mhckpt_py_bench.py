#!/usr/bin/env python3
"""Peer benchmark: mhckpt's own Python API (`import mhckpt`) on mhckpt-bench's model.

What it answers: what the Python layer (python/mhckpt and the nanobind binding
python/src/module.cc) adds to the C++ figures of bench/ckpt_bench.cc. So it
saves exactly the arrays `mhckpt-bench --mode save` saves, the same way:

  - the model of bench/model.cc (TrainingStateSpecs/BuildModel), byte for byte:
    8 arrays [rows, 4096] (bf16 params, fp32 master/adam_m/adam_v) split by
    rows over the ranks in mhckpt's floor layout, 64 norms, a 0-d int64 step
    and a uint32[624] rng_state held whole by every rank; every byte is
    bench/model.cc's Fill (splitmix64 of the name's FNV-1a hash, by global
    offset), so this script verifies a checkpoint written by mhckpt-bench and
    the other way round;
  - numpy leaves: mhckpt.Shard(row block, (begin, 0), (rows, 4096)) for the
    split arrays, plain numpy arrays for the whole ones; in one nested dict, as
    a user would pass it. With --leaves jax: jax.Array leaves instead (as
    orbax_bench.py builds them; rows padded to a multiple of the world sizes,
    jax needs even sharding), to show the JAX path's cost;
  - the same options (max_to_keep=2, independent transfer, default snapshot
    threads), the same sequence (a memcpy warm-up, a first save that touches
    the staging pool, reported apart, then --reps times: memcpy of the local
    bytes into touched memory, barrier, save(), wait_until_finished()), the
    same memory state (every array touched before; numpy's MADV_HUGEPAGE off,
    as C++'s new[] has none), the same per-rep figure (the slowest rank) and
    medians. Restores run in their own launch, into touched numpy arrays,
    scrubbed before and verified after every rep, as mhckpt-bench --mode
    restore does.

Worker (one mpirun job; mirrors mhckpt-bench's flags and writes its record
schema with system "mhckpt-py" or "mhckpt-jax"):

  mpirun -np 2 python/.venv/bin/python bench/peers/mhckpt_py_bench.py --mode save \\
      --mib 1024 --reps 3 --dir D --keep --json save.json
  mpirun -np 2 python/.venv/bin/python bench/peers/mhckpt_py_bench.py --mode restore \\
      --reps 3 --dir D --drop-caches --json restore.json

`--mode restore` reads the latest committed step under D/mhckpt-bench-sharded
(what either benchmark's save --keep left) or D itself, at any world size.

Driver (bench/peers/run_peers.sh's interface, one peers-schema record; launches
a save job at --np, a restore job at --np and one at --restore-np):

  python/.venv/bin/python bench/peers/mhckpt_py_bench.py --mib 1024 --np 2 --restore-np 4 \\
      --dir /var/tmp/p --reps 3 --json out.json [--drop-caches] [--leaves jax]

Extra figures in the records: overhead_s = save() time minus the C++ Save's own
time (SaveTimings snapshot + budget_wait), the Python layer's share of the stall;
with --breakdown, the time spent inside each _core call of save() and restore()
(a thin timing proxy around the binding object; off by default so that the
headline figures run the package untouched); with --profile PATH, cProfile
statistics of the timed saves and restores of rank 0.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
             "--mca", "btl_vader_single_copy_mechanism", "none"]
ROOT_NAME = "mhckpt-bench-sharded"  # the same subdirectory as mhckpt-bench --keep
# Metadata keys (mhckpt-bench stores bench_mib / bench_sharded as plain text;
# the Python API stores JSON, so these have names of their own).
MIB_KEY, SHARDED_KEY = "bench_py_mib", "bench_py_sharded"

now = time.perf_counter

# ---------------------------------------------------------------------------------------------
# bench/model.cc's bytes: Fill(p, n, NameSeed(name), offset).

_MASK = (1 << 64) - 1
_CHUNK = 1 << 20  # words per step: 8 MiB of output, two 8 MiB temporaries


def name_seed(name):
    """bench/model.cc NameSeed: 64-bit FNV-1a of the name's bytes."""
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & _MASK
    return h


def _words(np, seed, k0, n, out, tmp):
    """Words k0 .. k0+n-1 of the stream `seed` into out[:n] (splitmix64:
    z = (seed + k + 1) * golden mod 2^64, then the mix)."""
    z, t = out[:n], tmp[:n]
    z[...] = np.arange(n, dtype=np.uint64)
    z += np.uint64((seed + k0 + 1) & _MASK)
    z *= np.uint64(0x9E3779B97F4A7C15)
    np.right_shift(z, np.uint64(30), out=t)
    z ^= t
    z *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(z, np.uint64(27), out=t)
    z ^= t
    z *= np.uint64(0x94D049BB133111EB)
    np.right_shift(z, np.uint64(31), out=t)
    z ^= t


def fill(np, dst, seed, offset, check=False):
    """Writes (or, with check, compares against) bench/model.cc's bytes of
    stream `seed` from byte `offset` into the flat uint8 array `dst`. Offsets
    are multiples of 8 in this model. Returns True when equal (check)."""
    assert offset % 8 == 0
    n = dst.size
    words = -(-n // 8)
    cap = min(words, _CHUNK)
    buf, tmp = np.empty(cap, dtype=np.uint64), np.empty(cap, dtype=np.uint64)
    k = offset // 8
    for w in range(0, words, cap):
        m = min(cap, words - w)
        _words(np, seed, k + w, m, buf, tmp)
        got = buf[:m].view(np.uint8)[: min(8 * m, n - 8 * w)]
        part = dst[8 * w: 8 * w + got.size]
        if check:
            if not np.array_equal(part, got):
                return False
        else:
            part[...] = got
    return True


# ---------------------------------------------------------------------------------------------
# The model: bench/model.cc TrainingStateSpecs with small = 64, laid out for a world size.

def specs(mib, size):
    """[(name, dtype, shape, split by rows)], in mhckpt-bench's order."""
    rows = model.num_rows(mib, size)
    out = [(name, dt, (rows, model.COLS), True) for name, dt in model.LARGE]
    out += [(name, dt, tuple(shape), False) for name, dt, shape in model.SMALL]
    return out


def local_box(shape, split, rank, size):
    """(start, count) of this rank's box: rows [rows*r//n, rows*(r+1)//n) when
    split (and there are enough rows), else the whole array (IsSharded/LocalBox)."""
    if split and shape and shape[0] >= size:
        b, e = shape[0] * rank // size, shape[0] * (rank + 1) // size
        return [b] + [0] * (len(shape) - 1), [e - b] + list(shape[1:])
    return [0] * len(shape), list(shape)


def row_bytes(shape, dtype):
    n = model.ITEMSIZE[dtype]
    for s in shape[1:]:
        n *= s
    return n


class Local:
    """One rank's boxes of a model: numpy arrays, every page touched. A
    restore's destinations (``empty=mhckpt.empty``) start on a page, as
    PYTHON.md tells users to make in-place targets, so their rows can be read
    straight from the disk (``direct_reads``); numpy's own ``np.empty`` ones
    do not line up and are read through the page cache."""

    def __init__(self, np, spec_list, rank, size, filled=True, empty=None):
        self.items = []  # (name, dtype, shape, split, start, count, array)
        self.bytes = 0
        empty = empty or np.empty
        for name, dt, shape, split in spec_list:
            start, count = local_box(shape, split, rank, size)
            a = empty(count, model.numpy_dtype(dt))
            flat = a.reshape(-1).view(np.uint8)
            if filled:
                fill(np, flat, name_seed(name), start[0] * row_bytes(shape, dt) if start else 0)
            else:
                flat.fill(0)  # touched, as mhckpt-bench's destinations
            sharded = bool(split and shape and shape[0] >= size)  # IsSharded
            self.items.append((name, dt, shape, sharded, start, count, a))
            self.bytes += a.nbytes

    def flat_bytes(self, np):
        return [a.reshape(-1).view(np.uint8) for *_, a in self.items]

    def verify(self, np):
        """Names of the arrays whose bytes differ from the model's."""
        bad = []
        for name, dt, shape, _, start, _, a in self.items:
            off = start[0] * row_bytes(shape, dt) if start else 0
            if not fill(np, a.reshape(-1).view(np.uint8), name_seed(name), off, check=True):
                bad.append(name)
        return bad


def numpy_state(mhckpt, local):
    """The pytree a numpy user passes: Shard for the row blocks, arrays for the rest."""
    flat = {}
    for name, _, shape, sharded, start, _, a in local.items:
        flat[name] = mhckpt.Shard(a, start, shape) if sharded else a
    return model.nest(flat)


# ---------------------------------------------------------------------------------------------
# Worker: one MPI job.

class Ctx:
    def __init__(self, args):
        if not args.numpy_hugepages:
            # numpy asks for transparent huge pages on large arrays (madvise);
            # mhckpt-bench's new[] buffers have none. The same source memory for both.
            try:
                from numpy._core import multiarray as ma
            except ImportError:  # numpy < 2
                from numpy.core import multiarray as ma
            ma._set_madvise_hugepage(False)
        import numpy as np
        from mpi4py import MPI  # MPI_Init_thread(MULTIPLE), as mhckpt-bench
        self.np, self.MPI = np, MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.args = args
        self.jax = None
        if args.leaves == "jax":
            import jax
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.config.update("jax_enable_x64", True)  # the int64 step
            jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=self.size,
                                       process_id=self.rank)
            self.jax = jax
        import mhckpt
        self.mhckpt = mhckpt

    def barrier(self):
        self.comm.Barrier()

    def max(self, values):
        """Element-wise maximum over the ranks."""
        v = self.np.asarray(values, dtype=self.np.float64)
        out = self.np.empty_like(v)
        self.comm.Allreduce(v, out, op=self.MPI.MAX)
        return out.tolist()

    def manager(self, root, **kw):
        a = self.args
        mgr = self.mhckpt.CheckpointManager(
            root, self.comm, collective_transfer=a.transfer == "collective",
            snapshot_threads=a.threads, replica_parallel_min_bytes=a.replica_split_bytes, **kw)
        if a.breakdown:
            mgr._impl = TimedCore(mgr._impl)
        return mgr


class TimedCore:
    """Forwards to the binding's Manager object, adding up the time of each call."""

    def __init__(self, impl):
        self._impl = impl
        self.spent = {}

    def take(self):
        s, self.spent = self.spent, {}
        return s

    def __getattr__(self, name):
        f = getattr(self._impl, name)

        def timed(*a, **kw):
            t0 = now()
            try:
                return f(*a, **kw)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + now() - t0
        return timed


def version_info(ctx):
    from importlib.metadata import version
    v = {"mhckpt": ctx.mhckpt.__version__, "mhckpt_path": os.path.dirname(ctx.mhckpt.__file__),
         "numpy": ctx.np.__version__,
         "python": sys.version.split()[0], "mpi4py": version("mpi4py")}
    if ctx.jax is not None:
        v["jax"] = ctx.jax.__version__
    return v


def remove_all(ctx, path):
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    ctx.barrier()


def drop_caches(ctx):
    ok = 1
    if ctx.rank == 0:
        try:
            model.drop_caches()
        except OSError:
            ok = 0
    return ctx.comm.bcast(ok, root=0) == 1


def jax_rows(mib, size, restore_np):
    import math
    rows = model.num_rows(mib, size)
    m = math.lcm(size, restore_np or size)
    return -(-rows // m) * m


def jax_state(ctx, mib):
    """jax.Array leaves as orbax_bench.py builds them: one CPU device per process,
    the large arrays row-sharded (rows padded for even sharding), the rest replicated."""
    jax, np = ctx.jax, ctx.np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows = jax_rows(mib, ctx.size, ctx.args.restore_np)
    dev = jax.local_devices()[0]
    spec_list = [(n, dt, (rows, model.COLS) if split else shape, split)
                 for n, dt, shape, split in specs(mib, ctx.size)]
    local = Local(np, spec_list, ctx.rank, ctx.size)
    flat = {}
    for name, _, shape, split, _, _, a in local.items:
        sharding = NamedSharding(mesh, P("x", None) if split else P())
        flat[name] = jax.make_array_from_single_device_arrays(shape, sharding, [jax.device_put(a, dev)])
    jax.block_until_ready(flat)
    return model.nest(flat), local, rows


def run_save(ctx):
    a, np = ctx.args, ctx.np
    root = os.path.join(a.dir, ROOT_NAME)
    if ctx.jax is not None:
        state, local, rows = jax_state(ctx, a.mib)
        spec_list = [(n, dt, shape, split) for n, dt, shape, split, *_ in local.items]
    else:
        spec_list = specs(a.mib, ctx.size)
        local = Local(np, spec_list, ctx.rank, ctx.size)
        state = numpy_state(ctx.mhckpt, local)
        rows = spec_list[0][2][0]
    sharded = [n for n, _, shape, split in spec_list if split and shape[0] >= ctx.size]
    metadata = {MIB_KEY: a.mib, SHARDED_KEY: sharded}
    remove_all(ctx, root)

    # The memcpy reference: the same local bytes into touched memory.
    srcs = local.flat_bytes(np)
    ref = np.empty(max(local.bytes, 1), dtype=np.uint8)
    ref.fill(0x5A)

    def memcpy():
        t0 = now()
        off = 0
        for s in srcs:
            np.copyto(ref[off:off + s.size], s)
            off += s.size
        return now() - t0

    memcpy()  # warm-up
    ctx.barrier()  # StartMemory
    hwm_reset = model.reset_hwm()
    base = model.rss_bytes()
    mgr = ctx.manager(root, max_to_keep=2)
    prof = None
    if a.profile and ctx.rank == 0:
        import cProfile
        prof = cProfile.Profile()

    def timed_save(step, profile=False):
        ctx.barrier()
        if profile and prof:
            prof.enable()
        t0 = now()
        mgr.save(step, state, metadata)
        t1 = now()
        mgr.wait_until_finished()
        t2 = now()
        if profile and prof:
            prof.disable()
        t = mgr.last_save_timings()
        inner = {k: v for k, v in (mgr._impl.take().items() if a.breakdown else [])}
        own = t["snapshot"] + t["budget_wait"]
        v = ctx.max([t1 - t0, t2 - t0, t["gc"], t["snapshot"], t["plan"], t["write"], t["flush"],
                     t["commit"], t["budget_wait"], t1 - t0 - own, inner.get("save", 0.0),
                     inner.get("save", 0.0) - own])
        return {"stall": v[0], "commit": v[1], "gc": v[2], "phases": v[3:8], "budget_wait": v[8],
                "overhead": v[9], "core_save": v[10], "binding": v[11]}

    first = timed_save(0)
    samples = {k: [] for k in ("stall_s", "commit_s", "memcpy_s", "gc_s", "overhead_s", "budget_wait_s")}
    if a.breakdown:
        samples.update(core_save_s=[], binding_s=[])
    phases = [[] for _ in range(5)]
    step = 1
    for _ in range(a.reps):
        ctx.barrier()
        samples["memcpy_s"].append(ctx.max([memcpy()])[0])
        s = timed_save(step, profile=True)
        step += 1
        for k in ("stall", "commit", "gc", "overhead", "budget_wait"):
            samples[k + "_s"].append(s[k])
        if a.breakdown:
            for k in ("core_save", "binding"):
                samples[k + "_s"].append(s[k])
        for p in range(5):
            phases[p].append(s["phases"][p])
    hwm = model.hwm_bytes()
    rss_extra = ctx.max([max(hwm - base, 0)])[0]
    t = mgr.last_save_timings()
    written = ctx.comm.allgather(float(t["written_bytes"]))
    last = step - 1

    # Verify: restore the last step at this world size (page cache warm).
    dest = Local(np, spec_list, ctx.rank, ctx.size, filled=False, empty=ctx.mhckpt.empty)
    ctx.barrier()
    t0 = now()
    mgr.restore(last, restore_target(ctx, dest))
    verify_restore = ctx.max([now() - t0])[0]
    bad = dest.verify(np)
    verified = ctx.comm.allreduce(len(bad)) == 0
    del dest
    mgr.close()
    if not a.keep:
        remove_all(ctx, root)
    if prof:
        prof.dump_stats(a.profile + ".save")

    r = base_record(ctx, "save")
    gb = global_bytes(spec_list)
    r.update({
        "global_bytes": gb, "local_bytes_max": int(ctx.max([local.bytes])[0]),
        "n_arrays": len(spec_list), "sharded_arrays": len(sharded), "rows": rows,
        "stall_s": model.median(samples["stall_s"]), "commit_s": model.median(samples["commit_s"]),
        "memcpy_s": model.median(samples["memcpy_s"]), "gc_s": model.median(samples["gc_s"]),
        "overhead_s": model.median(samples["overhead_s"]),
        "budget_wait_s": model.median(samples["budget_wait_s"]),
        "first_stall_s": first["stall"], "first_commit_s": first["commit"],
        "peak_rss_extra_bytes": int(rss_extra), "hwm_reset": hwm_reset, "max_to_keep": 2,
        "written_bytes_per_rank": written, "samples": samples,
        "phases": {k: model.median(v) for k, v in zip(
            ["snapshot_s", "plan_s", "write_s", "flush_s", "marker_commit_s"], phases)},
        "verify_restore_s": verify_restore, "verified": verified, "root": root, "kept": a.keep,
        "notes": ("stall_s: mgr.save() call; commit_s: save() start until wait_until_finished() "
                  "returns; overhead_s: stall minus the C++ Save's own time (SaveTimings snapshot "
                  "+ budget_wait), per rep the slowest rank; memcpy_s: np.copyto of the same "
                  "local bytes into touched memory; the first save apart as first_stall_s; "
                  f"leaves: {a.leaves}"),
    })
    if a.breakdown:
        for k in ("core_save_s", "binding_s"):
            r[k] = model.median(samples[k])
    return r


def restore_target(ctx, dest):
    flat = {}
    for name, _, shape, sharded, start, _, arr in dest.items:
        flat[name] = ctx.mhckpt.Shard(arr, start, shape) if sharded else arr
    return model.nest(flat)


def jax_restore_target(ctx, spec_list):
    jax = ctx.jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(ctx.np.array(jax.devices()), ("x",))
    flat = {}
    for name, dt, shape, split in spec_list:
        sharded = split and shape[0] >= ctx.size and shape[0] % ctx.size == 0
        flat[name] = jax.ShapeDtypeStruct(shape, model.numpy_dtype(dt),
                                          sharding=NamedSharding(mesh, P("x", None) if sharded else P()))
    return model.nest(flat)


def jax_verify(ctx, got, spec_list):
    np = ctx.np
    bad = []
    g = model.flatten(got)
    for name, dt, shape, split in spec_list:
        for sh in g[name].addressable_shards:
            start = [sl.indices(n)[0] for sl, n in zip(sh.index, shape)]
            data = np.ascontiguousarray(np.asarray(sh.data))
            off = start[0] * row_bytes(shape, dt) if start else 0
            if not fill(np, data.reshape(-1).view(np.uint8), name_seed(name), off, check=True):
                bad.append(name)
    return bad


def run_restore(ctx):
    a, np = ctx.args, ctx.np
    root = os.path.join(a.dir, ROOT_NAME)
    if not os.path.isdir(root):
        root = a.dir
    mgr = ctx.manager(root, max_to_keep=0)  # delete nothing
    step = mgr.latest_step()
    if step is None:
        raise SystemExit(f"mhckpt_py_bench: no committed step in {root}")
    desc = mgr.describe(step)
    meta = desc["metadata"]
    if isinstance(meta.get(SHARDED_KEY), list):
        split_names = set(meta[SHARDED_KEY])
    elif isinstance(meta.get("bench_sharded"), str):  # written by mhckpt-bench
        split_names = set(meta["bench_sharded"].split(","))
    else:
        split_names = {n for n, d in desc["arrays"].items() if not d["replicated"]}
    mib = meta.get(MIB_KEY, meta.get("bench_mib"))
    mib = float(mib) if mib is not None else desc["total_bytes"] / 2**20
    spec_list = [(n, d["dtype"], tuple(d["shape"]), n in split_names) for n, d in desc["arrays"].items()]

    if ctx.jax is not None:
        target = jax_restore_target(ctx, spec_list)
        local_bytes = 0
        for name, dt, shape, split in spec_list:
            _, count = local_box(shape, split and shape[0] % ctx.size == 0, ctx.rank, ctx.size)
            local_bytes += int(np.prod(count, dtype=np.int64)) * model.ITEMSIZE[dt]
    else:
        dest = Local(np, spec_list, ctx.rank, ctx.size, filled=False, empty=ctx.mhckpt.empty)
        target = restore_target(ctx, dest)
        local_bytes = dest.bytes
    ctx.barrier()
    hwm_reset = model.reset_hwm()
    base = model.rss_bytes()
    prof = None
    if a.profile and ctx.rank == 0:
        import cProfile
        prof = cProfile.Profile()
    if a.breakdown:
        mgr._impl.take()  # not the calls above
    times, cores, verified, drop_ok, first_bad = [], [], True, True, ""
    for i in range(a.reps):
        if ctx.jax is None:
            for *_, arr in dest.items:
                arr.reshape(-1).view(np.uint8).fill(0xA5)
        if a.drop_caches:
            drop_ok &= drop_caches(ctx)
        ctx.barrier()
        if prof:
            prof.enable()
        t0 = now()
        got = mgr.restore(step, target)
        dt = now() - t0
        if prof:
            prof.disable()
        inner = mgr._impl.take() if a.breakdown else {}
        v = ctx.max([dt, inner.get("restore", 0.0), inner.get("describe", 0.0)])
        times.append(v[0])
        cores.append(v[1:])
        bad = jax_verify(ctx, got, spec_list) if ctx.jax is not None else dest.verify(np)
        if bad and not first_bad:
            first_bad = bad[0]
            print(f"mhckpt_py_bench: rank {ctx.rank}: restore {i} of step {step}: {len(bad)} arrays "
                  f"differ, first {bad[0]}", file=sys.stderr, flush=True)
        verified &= ctx.comm.allreduce(len(bad)) == 0
        del got
    rss_extra = ctx.max([max(model.hwm_bytes() - base, 0)])[0]
    mgr.close()
    if prof:
        prof.dump_stats(a.profile + ".restore")
    r = base_record(ctx, "restore")
    r.update({
        "mib": mib, "restore_np": ctx.size, "saved_np": desc["world_size"],
        "resharded": desc["world_size"] != ctx.size, "step": step,
        "global_bytes": global_bytes(spec_list), "local_bytes_max": int(ctx.max([local_bytes])[0]),
        "n_arrays": len(spec_list), "restore_s": model.median(times),
        "reshard_s": model.median(times) if desc["world_size"] != ctx.size else None,
        "peak_rss_extra_bytes": int(rss_extra), "hwm_reset": hwm_reset,
        "drop_caches": a.drop_caches, "drop_caches_ok": a.drop_caches and drop_ok,
        "verified": verified, "root": root,
        "samples": {"restore_s": times},
        "notes": ("restore_s: mgr.restore(step, target) of the latest step into touched, "
                  "page-aligned numpy arrays (mhckpt.empty) laid out for this world size (jax: new jax.Arrays from "
                  "ShapeDtypeStructs), scrubbed before and verified after every rep; per rep the "
                  f"slowest rank; page cache {'dropped before each rep' if a.drop_caches else 'warm'}; "
                  f"leaves: {a.leaves}"),
    })
    if a.breakdown:
        r["samples"].update({"core_restore_s": [c[0] for c in cores], "core_describe_s": [c[1] for c in cores]})
        r["core_restore_s"] = model.median([c[0] for c in cores])
        r["core_describe_s"] = model.median([c[1] for c in cores])
    return r


def global_bytes(spec_list):
    total = 0
    for _, dt, shape, _ in spec_list:
        n = model.ITEMSIZE[dt]
        for s in shape:
            n *= s
        total += n
    return total


def base_record(ctx, mode):
    a = ctx.args
    return {
        "system": "mhckpt-jax" if a.leaves == "jax" else "mhckpt-py",
        "version": a.version_tag or ctx.mhckpt.__version__,
        "versions": version_info(ctx), "case": "sharded", "mode": mode, "leaves": a.leaves,
        "np": ctx.size, "restore_np": None, "mib": a.mib, "reps": a.reps,
        "stall_s": None, "commit_s": None, "restore_s": None, "reshard_s": None, "fsync": True,
        "launcher": "mpirun", "transfer": a.transfer, "snapshot_threads": a.threads,
        "replica_split_bytes": a.replica_split_bytes, "numpy_hugepages": a.numpy_hugepages,
        "breakdown": a.breakdown,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": os.uname().nodename, "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
    }


def worker(args):
    ctx = Ctx(args)
    rec = run_save(ctx) if args.mode == "save" else run_restore(ctx)
    if ctx.rank == 0:
        if args.note:
            rec["notes"] += "; " + args.note
        if args.json:
            with open(args.json, "w") as f:
                json.dump([rec], f, indent=1)
        keys = ("system", "mode", "np", "mib", "stall_s", "overhead_s", "memcpy_s", "commit_s",
                "restore_s", "verified")
        print(json.dumps({k: rec.get(k) for k in keys}), flush=True)
    ok = ctx.comm.allreduce(0 if rec["verified"] else 1) == 0
    if ctx.jax is not None:
        ctx.jax.distributed.shutdown()
    return 0 if ok else 2


# ---------------------------------------------------------------------------------------------
# Driver: run_peers.sh's interface, one peers-schema record.

def mpirun(n, argv, leaves):
    cmd = shlex.split(os.environ.get("MPIRUN", "mpirun")) + ["-np", str(n)] + MPI_FLAGS + [
        sys.executable, os.path.abspath(__file__)] + argv
    if leaves == "jax":
        cmd += ["--port", str(model.free_port())]
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    print("mhckpt_py_bench:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)


def driver(args):
    os.makedirs(args.dir, exist_ok=True)
    common = ["--mib", str(args.mib), "--dir", args.dir, "--reps", str(args.reps), "--leaves", args.leaves,
              "--transfer", args.transfer, "--threads", str(args.threads)]
    if args.restore_np:
        common += ["--restore-np", str(args.restore_np)]
    drop = ["--drop-caches"] if args.drop_caches else []
    with tempfile.TemporaryDirectory() as tmp:
        parts = {}
        jobs = [("save", args.np_, ["--mode", "save", "--keep"]), ("restore", args.np_, ["--mode", "restore"] + drop)]
        if args.restore_np:
            jobs.append(("reshard", args.restore_np, ["--mode", "restore"] + drop))
        for key, n, extra in jobs:
            out = os.path.join(tmp, key + ".json")
            mpirun(n, extra + common + ["--json", out], args.leaves)
            with open(out) as f:
                parts[key] = json.load(f)[0]
    s, r = parts["save"], parts["restore"]
    q = parts.get("reshard")
    samples = {"stall_s": s["samples"]["stall_s"], "commit_s": s["samples"]["commit_s"],
               "restore_s": r["samples"]["restore_s"]}
    if q:
        samples["reshard_s"] = q["samples"]["restore_s"]
    verified = s["verified"] and r["verified"] and (q is None or q["verified"])
    system = s["system"]
    notes = (f"mhckpt's Python API ({system}: {args.leaves} leaves), mhckpt-bench's model and options "
             "(bench/peers/mhckpt_py_bench.py): stall = save(), commit = until wait_until_finished(), "
             "restore and reshard = restore() in separate launches at np and restore_np. "
             "Same fsync as mhckpt." + model.cache_note(args))
    version = os.environ.get("MHCKPT_BENCH_VERSION") or s["versions"]["mhckpt"]
    rec = model.record(system, f"mhckpt {version} (Python API)", args.mib, args.np_, args.restore_np,
                       args.reps, samples, s["peak_rss_extra_bytes"], True, verified, "mpirun", notes)
    rec["global_bytes"] = s["global_bytes"]
    rec["local_bytes_max"] = s["local_bytes_max"]
    for k in ("memcpy_s", "first_stall_s", "overhead_s", "phases", "leaves", "rows", "versions"):
        rec[k] = s.get(k)
    rec["samples"]["memcpy_s"] = s["samples"]["memcpy_s"]
    rec["samples"]["overhead_s"] = s["samples"]["overhead_s"]
    model.finish(args, rec)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["save", "restore"], default=None,
                   help="worker: run one MPI job's part (under mpirun); without it, the driver")
    p.add_argument("--mib", type=lambda v: int(v) if float(v).is_integer() else float(v), default=256)
    p.add_argument("--np", type=int, dest="np_", default=None, help="driver: processes that save")
    p.add_argument("--restore-np", type=int, default=None, help="driver: also restore at this many processes")
    p.add_argument("--dir", required=True, help="where checkpoints go (save: DIR/mhckpt-bench-sharded)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None, help="worker: write the record here; driver: append to this list")
    p.add_argument("--drop-caches", action="store_true", help="drop the page cache before each restore (root)")
    p.add_argument("--keep", action="store_true", help="save: keep the checkpoint (for a later restore)")
    p.add_argument("--leaves", choices=["numpy", "jax"], default="numpy")
    p.add_argument("--transfer", choices=["independent", "collective"], default="independent")
    p.add_argument("--threads", type=int, default=0, help="snapshot_threads (0: the library's default)")
    p.add_argument("--replica-split-bytes", type=int, default=0)
    p.add_argument("--numpy-hugepages", action="store_true",
                   help="leave numpy's MADV_HUGEPAGE on for large arrays (off: as mhckpt-bench's buffers)")
    p.add_argument("--breakdown", action="store_true", help="time each call into the binding (a proxy)")
    p.add_argument("--profile", default=None, help="rank 0: cProfile the timed calls into PATH.save/.restore")
    p.add_argument("--version-tag", default="")
    p.add_argument("--note", default="")
    p.add_argument("--port", type=int, default=0, help="jax: the jax.distributed coordinator port")
    args = p.parse_args()
    if args.mode:
        return worker(args)
    if args.np_ is None or args.json is None:
        p.error("the driver needs --np and --json")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
