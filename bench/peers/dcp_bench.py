#!/usr/bin/env python3
"""Peer benchmark: PyTorch Distributed Checkpoint (DCP) on the benchmark model (bench/peers/model.py).

Run with the venv's python (bench/peers/setup_venv.sh):

  python/.venv/bin/python bench/peers/dcp_bench.py --mib 256 --np 2 --restore-np 1 \
      --dir /tmp/peers/dcp --reps 3 --json out.json [--drop-caches]

The driver (the command above) starts the worker processes itself, N of them and then M,
each as `python/.venv/bin/python bench/peers/dcp_bench.py --role save|reshard ...` with
RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT in the environment; they form
a gloo process group.

The state dict: the 8 large arrays as DTensors row-sharded over a 1-D CPU DeviceMesh
([Shard(0)], built with DTensor.from_local from each rank's rows; DTensor's chunked layout,
ceil(rows/np) rows per rank), the 66 small ones as plain tensors (replicated; DCP
deduplicates them). Each rep saves a new step with dcp.async_save (default FileSystemWriter,
sync_files=True; its own gloo group, so that the timing collectives on the default group
do not interleave with the background save's), timing the call (stall) and the wait on its
future (commit). Restore: dcp.load into freshly allocated DTensors at N, and in a second
launch at M (DCP reshards on load). Two steps are kept; older ones are deleted untimed.
One untimed save and one untimed restore come first (the warm-up every system gets).

--stager default: async_save's own stager (a new DefaultStager per call: fresh CPU copies
every save). --stager cached: one DefaultStager kept across the saves (system "dcp-cached"):
it caches its CPU copies by source storage and copies into them again (pinned memory where
CUDA is available; StagingOptions otherwise off, so staging is synchronous as in the default).
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def step_dir(d, step):
    return os.path.join(d, f"step_{step:06d}")


def to_torch(a):
    import torch
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view("uint16")).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(model.numpy_dtype("bfloat16"))
    return t.numpy()


def state_dict(arrays, mesh, rows):
    import torch
    from torch.distributed.tensor import DTensor, Shard
    sd = {}
    for name, _ in model.LARGE:
        sd[name] = DTensor.from_local(to_torch(arrays[name]), mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size((rows, model.COLS)), stride=(model.COLS, 1))
    for name, _, _ in model.SMALL:
        sd[name] = to_torch(arrays[name])
    return sd


def empty_arrays(rows, rank, size):
    import numpy as np
    out = {}
    b, e = model.row_range(rows, rank, size, "ceil")
    for name, dt in model.LARGE:
        out[name] = np.zeros((e - b, model.COLS), dtype=model.numpy_dtype(dt))
    for name, dt, shape in model.SMALL:
        out[name] = np.zeros(shape, dtype=model.numpy_dtype(dt))
    return out


def verify(got, rows, begin, end):
    ok = True
    for name, dt in model.LARGE:
        ok = ok and model.same_bytes(got[name], model.large_block(name, dt, rows, begin, end))
    for name, dt, shape in model.SMALL:
        ok = ok and model.same_bytes(got[name], model.small_array(name, dt, shape))
    return ok


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    rows = model.num_rows(args.mib, args.np_)
    begin, end = model.row_range(rows, rank, size, "ceil")

    def tmax(x):
        t = torch.tensor([float(x)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def maybe_drop():
        if args.drop_caches and rank == 0:
            model.drop_caches()
        dist.barrier()

    res = {"stall_s": [], "commit_s": [], "restore_s": [], "reshard_s": []}
    last = args.reps  # step 0 is the warm-up
    if args.role == "save":
        save_group = dist.new_group(backend="gloo")
        stager = None
        if args.stager == "cached":
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            stager = DefaultStager(StagingOptions(use_pinned_memory=torch.cuda.is_available(),
                                                  use_shared_memory=False, use_async_staging=False,
                                                  use_non_blocking_copy=False))
        arrays = model.build_local(args.mib, size, rank, "ceil")
        sd = state_dict(arrays, mesh, rows)
        dist.barrier()
        base = model.rss_bytes()
        model.reset_hwm()
        for step in range(args.reps + 1):
            dist.barrier()
            t0 = model.now()
            fut = dcp.async_save(sd, checkpoint_id=step_dir(args.dir, step), process_group=save_group,
                                 async_stager=stager)
            t1 = model.now()
            # Future, or AsyncSaveResponse(staging_completion, upload_completion) in some configurations.
            (getattr(fut, "upload_completion", None) or fut).result()
            t2 = model.now()
            stall, commit = tmax(t1 - t0), tmax(t2 - t0)
            if step > 0:
                res["stall_s"].append(stall)
                res["commit_s"].append(commit)
            dist.barrier()
            if rank == 0 and step >= 2:
                shutil.rmtree(step_dir(args.dir, step - 2))
        res["peak_rss_extra_bytes"] = tmax(model.hwm_bytes() - base)
        if stager is not None:
            stager.close()
        del sd, arrays, stager
        key = "restore_s"
    else:
        key = "reshard_s"
    verified = True
    for i in range(args.reps + 1):  # i == 0: the warm-up
        got = empty_arrays(rows, rank, size)
        target = state_dict(got, mesh, rows)
        maybe_drop()
        t0 = model.now()
        dcp.load(target, checkpoint_id=step_dir(args.dir, last))
        dist.barrier()
        if i > 0:
            res[key].append(tmax(model.now() - t0))
        if i == 0:
            # The small tensors may have been replaced in the dict rather than filled in place.
            for name, _, _ in model.SMALL:
                got[name] = to_numpy(target[name])
            verified = verify(got, rows, begin, end)
        del got, target
    res["verified_" + key] = tmax(0.0 if verified else 1.0) == 0.0
    res["torch"] = torch.__version__
    if rank == 0:
        with open(args.out_part, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def launch(n, argv, out_part):
    port = model.free_port()
    procs = []
    cmd = [sys.executable, os.path.abspath(__file__)] + argv + ["--out-part", out_part]
    print(f"dcp_bench: {n} x", " ".join(cmd), flush=True)
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env))
    return model.spawn("dcp_bench", procs, out_part)


def main():
    p = model.common_args(__doc__.splitlines()[0])
    p.add_argument("--stager", choices=["default", "cached"], default="default",
                   help="async_save's stager (see the top of this file)")
    args = p.parse_args()
    if args.role != "driver":
        return worker(args)
    r, samples, verified = model.drive(args, launch, ["--stager", args.stager])
    stager = ("one DefaultStager kept across saves (cached CPU copies)" if args.stager == "cached"
              else "the default stager (new CPU copies every save)")
    notes = (f"torch {r['torch']} (PyPI wheel, CPU only), gloo, N worker processes; {stager}; one untimed "
             "warm-up save and restore. DTensor [Shard(0)] "
             "over a CPU DeviceMesh (chunked rows: ceil(rows/np) per rank), small arrays as plain "
             "tensors. dcp.async_save (thread; the stager copies into CPU memory) with the default "
             "FileSystemWriter, sync_files=True: os.fsync on every .distcp data file and on .metadata.tmp "
             "before its rename to .metadata (strace); the step directory is never fsynced, so the "
             "rename is not itself durable. stall = async_save "
             "call, commit = until its future is done. Restore and reshard: dcp.load into new "
             "DTensors; reshard is a separate launch at restore_np." + model.cache_note(args))
    system = "dcp-cached" if args.stager == "cached" else "dcp"
    rec = model.record(system, f"torch {r['torch']}", args.mib, args.np_, args.restore_np, args.reps, samples,
                       r["peak_rss_extra_bytes"], True, verified, "processes", notes, layout="ceil")
    model.finish(args, rec)


if __name__ == "__main__":
    main()
