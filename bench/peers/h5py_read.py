#!/usr/bin/python3
"""A cold read of any mhckpt step's data file the way the h5py peer restores
(bench/peers/h5py_bench.py): File(driver='mpio'); each rank reads its rows of
every dataset that has at least one row per rank, collectively, and every other
dataset whole, into new numpy arrays. Prints one JSON object: the slowest rank's
seconds from the open to the close (a barrier after it) and the bytes read.
For the rounds of bench/run_prefault.sh (the same file as mhckpt's restores):

  mpirun -np N /usr/bin/python3 bench/peers/h5py_read.py DATA.h5
"""
import json
import sys
import time

import h5py
import numpy as np
from mpi4py import MPI


def main(path):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    comm.Barrier()
    t0 = time.perf_counter()
    got = 0
    with h5py.File(path, "r", driver="mpio", comm=comm) as f:
        names = []
        f.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
        for name in sorted(names):
            d = f[name]
            if d.ndim >= 1 and d.shape[0] >= size:
                begin, end = d.shape[0] * rank // size, d.shape[0] * (rank + 1) // size
                a = np.zeros((end - begin,) + d.shape[1:], dtype=d.dtype)
                with d.collective:
                    d.read_direct(a, np.s_[begin:end], np.s_[0:end - begin])
            else:
                a = d[()]
            got += np.asarray(a).nbytes
    comm.Barrier()
    t = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    got = comm.allreduce(got)
    if rank == 0:
        print(json.dumps({"restore_s": t, "bytes": got}))


if __name__ == "__main__":
    main(sys.argv[1])
