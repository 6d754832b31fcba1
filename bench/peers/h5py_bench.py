#!/usr/bin/python3
"""Peer benchmark: a plain h5py collective write of the benchmark model (bench/peers/model.py).

Run it with Debian's python (h5py built on parallel HDF5, python3-h5py-mpi, and
python3-mpi4py), not inside the venv (python/.venv):

  /usr/bin/python3 bench/peers/h5py_bench.py --mib 256 --np 2 --restore-np 1 \
      --dir /tmp/peers/h5py --reps 3 --json out.json [--drop-caches]

The driver (the command above) launches the MPI jobs itself, twice:

  mpirun -np N  [flags] /usr/bin/python3 bench/peers/h5py_bench.py --role save    ...
  mpirun -np M  [flags] /usr/bin/python3 bench/peers/h5py_bench.py --role reshard ...

with flags --oversubscribe --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none
(and OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 as root). MPIRUN overrides the
mpirun command.

Each rep saves a new step to its own file: File(driver='mpio'), every dataset created by
all ranks (contiguous, no fill), each large dataset written collectively
(`with dset.collective:`), the small ones by rank 0; close; then rank 0 reopens the file
and os.fsync()s it and the directory. Synchronous: stall == commit. Restore: each rank
reads its rows of every large dataset collectively and every small one whole, into new
arrays. bfloat16 arrays are stored as uint16 (HDF5 has no bfloat16; same bytes). Two
steps are kept on disk; older ones are deleted outside the timed region. One untimed save
and one untimed restore come first (the warm-up every system gets).
"""
import json
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
             "--mca", "btl_vader_single_copy_mechanism", "none"]


def step_path(d, step):
    return os.path.join(d, f"step_{step:06d}.h5")


def h5_dtype(dt):
    import numpy as np
    return np.dtype(np.uint16) if dt == "bfloat16" else np.dtype(dt)


def save(comm, h5py, path, arrays, rows, begin, end):
    rank = comm.Get_rank()
    with h5py.File(path, "w", driver="mpio", comm=comm) as f:
        dsets = {}
        for name, dt in model.LARGE:
            dsets[name] = f.create_dataset(name, shape=(rows, model.COLS), dtype=h5_dtype(dt))
        small = {}
        for name, dt, shape in model.SMALL:
            small[name] = f.create_dataset(name, shape=shape, dtype=h5_dtype(dt))
        for name, _ in model.LARGE:
            d = dsets[name]
            with d.collective:
                d[begin:end] = arrays[name].view(d.dtype)
        if rank == 0:
            for name, _, _ in model.SMALL:
                small[name][()] = arrays[name]
    if rank == 0:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    comm.Barrier()


def restore(comm, h5py, path, rows, begin, end):
    import numpy as np
    out = {}
    with h5py.File(path, "r", driver="mpio", comm=comm) as f:
        for name, dt in model.LARGE:
            d = f[name]
            a = np.zeros((end - begin, model.COLS), dtype=d.dtype)
            with d.collective:
                d.read_direct(a, np.s_[begin:end], np.s_[0:end - begin])
            out[name] = a.view(model.numpy_dtype(dt))
        for name, dt, shape in model.SMALL:
            out[name] = f[name][()]
            out[name] = np.asarray(out[name]).view(model.numpy_dtype(dt)).reshape(shape)
    comm.Barrier()
    return out


def maybe_drop(comm, args):
    if args.drop_caches and comm.Get_rank() == 0:
        model.drop_caches()
    comm.Barrier()


def worker(args):
    from mpi4py import MPI
    import h5py
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = model.num_rows(args.mib, args.np_)  # the saved model's shape, whatever the job size
    begin, end = model.row_range(rows, rank, size, "floor")
    res = {"stall_s": [], "commit_s": [], "restore_s": [], "reshard_s": []}
    tmax = lambda t: comm.allreduce(t, op=MPI.MAX)  # noqa: E731
    last = args.reps  # step 0 is the warm-up
    if args.role == "save":
        arrays = model.build_local(args.mib, size, rank, "floor")
        comm.Barrier()
        base = model.rss_bytes()
        model.reset_hwm()
        for step in range(args.reps + 1):
            comm.Barrier()
            t0 = model.now()
            save(comm, h5py, step_path(args.dir, step), arrays, rows, begin, end)
            t = tmax(model.now() - t0)
            if step > 0:
                res["stall_s"].append(t)
                res["commit_s"].append(t)
            if rank == 0 and step >= 2:
                os.remove(step_path(args.dir, step - 2))
            comm.Barrier()
        res["peak_rss_extra_bytes"] = tmax(model.hwm_bytes() - base)
        del arrays
        key, layout_np = "restore_s", size
    else:
        key, layout_np = "reshard_s", size
    verified = True
    for i in range(args.reps + 1):  # i == 0: the warm-up
        maybe_drop(comm, args)
        t0 = model.now()
        got = restore(comm, h5py, step_path(args.dir, last), rows, begin, end)
        t = tmax(model.now() - t0)
        if i > 0:
            res[key].append(t)
        if i == 0:
            ok = model.verify_local(got, args.mib, layout_np, rank, "floor") if size == args.np_ else \
                verify_box(got, args.mib, rows, begin, end)
            verified = verified and ok
        del got
    res["verified_" + key] = comm.allreduce(verified, op=MPI.LAND)
    res["h5py"] = h5py.version.version
    res["hdf5"] = h5py.version.hdf5_version
    if rank == 0:
        with open(args.out_part, "w") as f:
            json.dump(res, f)


def verify_box(got, mib, rows, begin, end):
    ok = True
    for name, dt in model.LARGE:
        ok = ok and model.same_bytes(got[name], model.large_block(name, dt, rows, begin, end))
    for name, dt, shape in model.SMALL:
        ok = ok and model.same_bytes(got[name], model.small_array(name, dt, shape))
    return ok


def mpirun(n, argv, out_part):
    cmd = shlex.split(os.environ.get("MPIRUN", "mpirun")) + ["-np", str(n)] + MPI_FLAGS + [
        "/usr/bin/python3", os.path.abspath(__file__)] + argv + ["--out-part", out_part]
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("PYTHONHOME", None)
    env.pop("VIRTUAL_ENV", None)
    print("h5py_bench:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, env=env, check=True)
    with open(out_part) as f:
        return json.load(f)


def main():
    p = model.common_args(__doc__.splitlines()[0])
    args = p.parse_args()
    if args.role != "driver":
        return worker(args)
    r, samples, verified = model.drive(args, mpirun)
    notes = (f"h5py {r['h5py']} on HDF5 {r['hdf5']} (Debian python3-h5py-mpi), driver=mpio, one file "
             "per step, contiguous datasets, large ones written and read collectively, small ones "
             "written by rank 0; durability: the benchmark closes the file, then rank 0 os.fsync()s "
             "the file and its directory (h5py/HDF5 do not fsync by themselves). Synchronous: "
             "stall == commit. bf16 stored as uint16. mhckpt's row layout (floor). Each restore "
             "opens the last step; reshard is a separate mpirun at restore_np." + model.cache_note(args))
    rec = model.record("h5py", f"h5py {r['h5py']} / HDF5 {r['hdf5']}", args.mib, args.np_, args.restore_np,
                       args.reps, samples, r["peak_rss_extra_bytes"], True, verified, "mpirun", notes)
    model.finish(args, rec)


if __name__ == "__main__":
    main()
