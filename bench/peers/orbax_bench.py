#!/usr/bin/env python3
"""Peer benchmark: Orbax (orbax-checkpoint on jax, CPU) on the benchmark model (bench/peers/model.py).

Run with the venv's python (bench/peers/setup_venv.sh):

  python/.venv/bin/python bench/peers/orbax_bench.py --mib 256 --np 2 --restore-np 1 \
      --dir /tmp/peers/orbax --reps 3 --json out.json [--drop-caches]

The driver (the command above) starts N worker processes, then M, each as
`python/.venv/bin/python bench/peers/orbax_bench.py --role save|reshard ... --rank r --port P`;
every worker calls jax.distributed.initialize("127.0.0.1:P", num_processes, process_id) and
has one CPU device, so the global mesh has one device per process (CPU collectives: gloo).

The 8 large arrays are jax.Arrays [rows, 4096] with NamedSharding(mesh, P('x', None)), built
from each process's own rows; the 66 small ones are replicated (P()). jax requires the sharded
axis to divide evenly, so rows are padded up to a multiple of lcm(np, restore_np) with more of
the same pseudo-random stream (a few rows; the record's byte counts are those saved). Each rep
saves a new step through an async ocp.CheckpointManager (StandardSave, max_to_keep=2 with
enable_background_delete, as mhckpt frees old steps in the background; Orbax defaults otherwise: OCDBT, TensorStore): stall = the save() call, commit = until
wait_until_finished() returns. Restore: StandardRestore with the same sharding, and in a second
launch with an M-process mesh. One untimed save and one untimed restore come first (the warm-up
every system gets).
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def padded_rows(mib, np_, restore_np):
    rows = model.num_rows(mib, np_)
    m = math.lcm(np_, restore_np or np_)
    return -(-rows // m) * m


def worker(args):
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_x64", True)  # the int64 step array; jax narrows it to int32 otherwise
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.world, process_id=args.rank)
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    rank, size = jax.process_index(), jax.process_count()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    row_sharding = NamedSharding(mesh, P("x", None))
    replicated = NamedSharding(mesh, P())
    dev = jax.local_devices()[0]
    rows = padded_rows(args.mib, args.np_, args.restore_np)
    chunk = rows // size
    begin, end = rank * chunk, (rank + 1) * chunk

    def tmax(x):
        return float(np.max(multihost_utils.process_allgather(np.array([x], dtype=np.float64))))

    def barrier(name):
        multihost_utils.sync_global_devices(name)

    def maybe_drop(i):
        if args.drop_caches and rank == 0:
            model.drop_caches()
        barrier(f"drop{i}")

    res = {"stall_s": [], "commit_s": [], "restore_s": [], "reshard_s": []}
    # Old steps deleted in Orbax's background thread, as mhckpt frees its
    # retired steps (each at its best settings; close() waits for both).
    opts = ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=True,
                                        enable_background_delete=True)
    mgr = ocp.CheckpointManager(os.path.abspath(args.dir), options=opts)
    last = args.reps  # step 0 is the warm-up
    if args.role == "save":
        flat = {}
        for name, dt in model.LARGE:
            local = model.large_block(name, dt, rows, begin, end)
            flat[name] = jax.make_array_from_single_device_arrays(
                (rows, model.COLS), row_sharding, [jax.device_put(local, dev)])
            del local
        for name, dt, shape in model.SMALL:
            flat[name] = jax.make_array_from_single_device_arrays(
                shape, replicated, [jax.device_put(model.small_array(name, dt, shape), dev)])
        state = model.nest(flat)
        jax.block_until_ready(state)
        barrier("built")
        base = model.rss_bytes()
        model.reset_hwm()
        for step in range(args.reps + 1):
            barrier(f"save{step}")
            t0 = model.now()
            mgr.save(step, args=ocp.args.StandardSave(state))
            t1 = model.now()
            mgr.wait_until_finished()
            t2 = model.now()
            stall, commit = tmax(t1 - t0), tmax(t2 - t0)
            if step > 0:
                res["stall_s"].append(stall)
                res["commit_s"].append(commit)
        res["peak_rss_extra_bytes"] = tmax(model.hwm_bytes() - base)
        del state, flat
        key = "restore_s"
    else:
        key = "reshard_s"
    abstract = {}
    for name, dt in model.LARGE:
        abstract[name] = jax.ShapeDtypeStruct((rows, model.COLS), model.numpy_dtype(dt), sharding=row_sharding)
    for name, dt, shape in model.SMALL:
        abstract[name] = jax.ShapeDtypeStruct(shape, model.numpy_dtype(dt), sharding=replicated)
    abstract = model.nest(abstract)
    verified = True
    for i in range(args.reps + 1):  # i == 0: the warm-up
        maybe_drop(i)
        t0 = model.now()
        got = mgr.restore(last, args=ocp.args.StandardRestore(abstract))
        jax.block_until_ready(got)
        t = tmax(model.now() - t0)
        if i > 0:
            res[key].append(t)
        if i == 0:
            g = model.flatten(got)
            for name, dt in model.LARGE:
                shards = g[name].addressable_shards
                b, e, _ = shards[0].index[0].indices(rows)
                ok = len(shards) == 1 and (b, e) == (begin, end) and model.same_bytes(
                    np.asarray(shards[0].data), model.large_block(name, dt, rows, begin, end))
                if not ok:
                    print(f"orbax_bench: rank {rank}: {name} rows [{b}, {e}) differ from [{begin}, {end})",
                          flush=True)
                verified = verified and ok
            for name, dt, shape in model.SMALL:
                ok = model.same_bytes(np.asarray(g[name].addressable_shards[0].data),
                                      model.small_array(name, dt, shape))
                if not ok:
                    print(f"orbax_bench: rank {rank}: {name} differs", flush=True)
                verified = verified and ok
        del got
    res["verified_" + key] = tmax(0.0 if verified else 1.0) == 0.0
    mgr.close()
    from importlib.metadata import version
    res["versions"] = {p: version(p) for p in ("orbax-checkpoint", "jax", "jaxlib", "tensorstore")}
    res["rows"] = rows
    if rank == 0:
        with open(args.out_part, "w") as f:
            json.dump(res, f)
    barrier("end")


def launch(n, argv, out_part):
    port = model.free_port()
    cmd = [sys.executable, os.path.abspath(__file__)] + argv + [
        "--out-part", out_part, "--port", str(port), "--world", str(n)]
    print(f"orbax_bench: {n} x", " ".join(cmd), "--rank R", flush=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(n)]
    return model.spawn("orbax_bench", procs, out_part)


def main():
    p = model.common_args(__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    if args.role != "driver":
        return worker(args)
    r, samples, verified = model.drive(
        args, launch, ["--restore-np", str(args.restore_np)] if args.restore_np else [])
    v = r["versions"]
    rows0 = model.num_rows(args.mib, args.np_)
    pad = r["rows"] - rows0
    notes = (f"orbax-checkpoint {v['orbax-checkpoint']}, jax {v['jax']}, tensorstore {v['tensorstore']}; "
             f"N processes (jax.distributed.initialize on localhost, one CPU device each, gloo). "
             f"Async CheckpointManager (max_to_keep=2, background delete, OCDBT defaults), StandardSave/StandardRestore. "
             f"Rows padded {rows0} -> {r['rows']} (+{pad} rows, jax needs even sharding over "
             f"lcm(np, restore_np)); byte counts are those saved. Durability: TensorStore's file "
             f"kvstore fsyncs the data files, manifests and its directories (context file_io_sync, "
             f"default true; strace); Orbax's own _CHECKPOINT_METADATA and the final rename of "
             f"<step>.orbax-checkpoint-tmp are not fsynced (bench/peers/README.md). Reshard: separate launch at "
             f"restore_np." + model.cache_note(args))
    rec = model.record("orbax", f"orbax-checkpoint {v['orbax-checkpoint']} / jax {v['jax']}", args.mib, args.np_,
                       args.restore_np, args.reps, samples, r["peak_rss_extra_bytes"], True, verified,
                       "processes", notes, layout="ceil")
    # The saved shape includes the padding rows.
    extra = pad * model.COLS * sum(model.ITEMSIZE[dt] for _, dt in model.LARGE)
    rec["global_bytes"] += extra
    rec["local_bytes_max"] = (r["rows"] // args.np_) * model.COLS * sum(
        model.ITEMSIZE[dt] for _, dt in model.LARGE) + model.small_bytes()
    model.finish(args, rec)


if __name__ == "__main__":
    main()
