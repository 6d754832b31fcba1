"""``python -m mhckpt convert SRC DST``: checkpoints of other libraries into
an mhckpt step, and an mhckpt step out to safetensors.

Sources (found by what SRC holds, or ``--from``):
  - orbax: an Orbax step directory (items as subdirectories: ``state/``,
    ``meta/``, ...), one item directory, or an Orbax root (its latest step,
    or ``--step``). Pytree items are read through ``orbax.checkpoint``
    (tensorstore); JSON items through its JsonCheckpointHandler.
  - dcp: a torch.distributed.checkpoint directory (``.metadata``), read
    through DCP's ``FileSystemReader``: its metadata, and each item's slice
    of its file ``torch.load``-ed as the reader does (non-tensor entries and
    items with storage transforms: through DCP's ``load``).
  - safetensors: a ``.safetensors`` file, or a directory of them with
    ``model.safetensors.index.json``, read through the ``safetensors`` library.
  - mhckpt: an mhckpt root (``step_*``), its latest step or ``--step``.

Destinations: an mhckpt root (the step: the Orbax step's number, else
``--step``, else 0), or safetensors (DST ending in ``.safetensors``, or
``--to safetensors``: a directory with ``model.safetensors`` at one process,
``model-0000i-of-0000N.safetensors`` files and ``model.safetensors.index.json``
at N processes).

Names (the rule): a leaf's mhckpt name is its key path joined with ``/``, as
mhckpt's own API names it. Orbax: the item name, then the tree path
(``state/params/w1``; sequence items by index); a lone item directory by its
tree paths alone. DCP: the state dict's key path
as DCP records it (``model/0.weight``, ``optim/state/0.weight/exp_avg``);
non-tensor entries are unpickled and named further by their own path
(``optim/param_groups/0/betas/0``). safetensors: the tensor's name unchanged,
both ways. So ``mhckpt.orbax`` restores a converted Orbax step with the same
``args`` as the original, and ``mhckpt.torch.load`` a converted DCP
checkpoint with the same state dict.

Nothing is lost. Orbax: arrays of every dtype mhckpt stores; Python
scalars and strings (read on every process) as values of their type; None,
which Orbax records for None and for every leafless node alike (optax's
EmptyState, MaskedNode), as a None value, which ``mhckpt.orbax`` restores
into whichever the target holds there; empty dicts, lists and tuples
recorded in the step's metadata ``orbax.empty``, given back by a restore
without a target. DCP: the pickled non-tensor entries unpickled into plain
values, tensors and numpy arrays or scalars inside them as arrays, empty
containers recorded in ``dcp.empty``. safetensors keeps an mhckpt step's
values as JSON under its metadata key ``mhckpt.values`` (and reads them
back). Other Python objects, and dtypes mhckpt does not store (complex,
other float8 kinds), raise, naming the leaf.

It runs under mpirun at any process count: the arrays are dealt to the
processes by size, each reads its own whole and saves (or writes) them, and
mhckpt checksums every byte it writes and checks every byte it reads.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _leaves
from ._errors import InvalidArgumentError, IoError, NotFoundError
from ._manager import CheckpointManager
from ._shard import Shard
from ._sources import (
    INDEX,
    VALUES_META,
    DcpSource,
    OrbaxSource,
    SafetensorsSource,
    Source,
    is_orbax_item,
    is_orbax_step,
    numpy_to_torch,
    subdirs,
)

_STEP_DIR = re.compile(r"^step_(\d{10})$")


def deal(arrays: Dict[str, Tuple[Tuple[int, ...], str]], size: int) -> Dict[str, int]:
    """Array name -> the rank that reads it: largest first, to the rank with
    the fewest bytes so far (the same on every rank)."""
    load = [0] * size
    out = {}
    sized = []
    for name, (shape, dtype) in arrays.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * _leaves.numpy_dtype(dtype).itemsize
        sized.append((-nbytes, name))
    for neg, name in sorted(sized):
        r = min(range(size), key=lambda i: (load[i], i))
        out[name] = r
        load[r] += -neg
    return out


# --------------------------------------------------------------- mhckpt in


def _mhckpt_step(mgr: CheckpointManager, step: Optional[int]) -> int:
    if step is None:
        step = mgr.latest_step()
        if step is None:
            raise NotFoundError(f"{mgr.root}: no committed step")
    return int(step)


def _is_mhckpt_root(path: str) -> bool:
    return os.path.isdir(path) and any(_STEP_DIR.match(d) for d in os.listdir(path))


# --------------------------------------------------------------- the writes


def to_mhckpt(src: Source, dst: str, step: int, comm) -> int:
    """Saves ``src`` as step ``step`` of the mhckpt root ``dst``; returns the
    bytes this rank read."""
    owner = deal(src.arrays, comm.size)
    mine = [n for n, r in owner.items() if r == comm.rank]
    # The manager first, with the bytes this rank will save: its staging
    # memory is touched in the background while the source is read, so the
    # save copies into touched memory.
    mine_bytes = sum(int(np.prod(src.arrays[n][0], dtype=np.int64)) *
                     _leaves.numpy_dtype(src.arrays[n][1]).itemsize for n in mine)
    with CheckpointManager(dst, comm, reserve=mine_bytes) as mgr:
        return _read_and_save(src, mgr, owner, mine, step, comm)


def _read_and_save(src: Source, mgr: CheckpointManager, owner: Dict[str, int], mine: List[str],
                   step: int, comm) -> int:
    err: Optional[BaseException] = None
    data: Dict[str, np.ndarray] = {}
    try:
        data = src.read(mine)
    except Exception as e:  # agreed below: every rank raises
        err = e
    errors = comm.allgather(None if err is None else f"rank {comm.rank}: {type(err).__name__}: {err}")
    if any(errors):
        raise InvalidArgumentError("convert: reading the source failed: " + "; ".join(e for e in errors if e))
    # 0-d arrays have no empty block: their reader sends them to every rank.
    scalars = {n: data.get(n) for n, (shape, _) in src.arrays.items() if shape == ()}
    for n in scalars:
        scalars[n] = comm.bcast(data.get(n), root=owner[n])
    state: Dict[str, Any] = {}
    for n, (shape, dtype) in src.arrays.items():
        if shape == ():
            state[n] = np.asarray(scalars[n])
            continue
        a = data.get(n)
        if a is None:
            a = np.empty((0,) + tuple(shape[1:]), _leaves.numpy_dtype(dtype))
        elif tuple(a.shape) != tuple(shape) or _leaves.numpy_dtype_name(n, a.dtype) != dtype:
            raise InvalidArgumentError(
                f"array '{n}': read {a.dtype}{a.shape}, the metadata says {dtype}{shape}")
        state[n] = Shard(a, (0,) * len(shape), shape)
    state.update(src.values)
    mgr.save(step, state, metadata=src.metadata)
    return sum(a.nbytes for a in data.values())


def to_safetensors(root: str, step: Optional[int], dst: str, comm) -> Tuple[int, List[str]]:
    """Writes step ``step`` (None: the latest) of the mhckpt root ``root`` as
    safetensors at ``dst``; returns (this rank's bytes, the files written).

    Collective. Each rank's own work (reading the catalogue, building its
    targets, making ``dst``, writing its file, rank 0's index) is agreed
    through the manager before the next collective step: an error on any
    rank is raised, the same, on every rank, and no rank waits for one that
    failed."""
    with CheckpointManager(root, comm, own_root=False) as mgr:
        err: Optional[BaseException] = None
        target: Dict[str, Any] = {}
        arrays: Dict[str, Tuple[Tuple[int, ...], str]] = {}
        owner: Dict[str, int] = {}
        desc: Dict[str, Any] = {}
        try:
            from safetensors.torch import save_file

            if dst.endswith(".safetensors") and comm.size != 1:
                raise InvalidArgumentError(
                    f"{dst}: one .safetensors file is written by one process; give a directory")
            step = _mhckpt_step(mgr, step)
            desc = mgr.describe(step)
            arrays = {n: (tuple(a["shape"]), a["dtype"]) for n, a in desc["arrays"].items()}
            owner = deal(arrays, comm.size)
            for n, (shape, dtype) in arrays.items():
                dt = _leaves.numpy_dtype(dtype)
                if shape == ():
                    target[n] = np.empty((), dt)
                elif owner[n] == comm.rank:
                    target[n] = Shard(_leaves.new_array(shape, dt), (0,) * len(shape), shape)
                else:
                    target[n] = Shard(np.empty((0,) + shape[1:], dt), (0,) * len(shape), shape)
        except Exception as e:  # agreed next: every rank raises
            err = e
        mgr._agree(err)
        got = mgr.restore(step, target, strict=True)
        mine = {n: (got[n].local if isinstance(got[n], Shard) else got[n])
                for n in arrays if owner[n] == comm.rank}
        meta = {VALUES_META: json.dumps(desc["values"], sort_keys=True)} if desc["values"] else {}
        if dst.endswith(".safetensors"):
            files = [dst]
        elif comm.size == 1:
            files = [os.path.join(dst, "model.safetensors")]
        else:
            files = [os.path.join(dst, f"model-{r + 1:05d}-of-{comm.size:05d}.safetensors")
                     for r in range(comm.size)]
        if not dst.endswith(".safetensors"):
            try:
                if comm.rank == 0:
                    os.makedirs(dst, exist_ok=True)
            except Exception as e:
                err = e
            mgr._agree(err)  # also: the directory exists before any rank writes into it
        try:
            tensors = {n: numpy_to_torch(a) for n, a in mine.items()}
            try:
                save_file(tensors, files[comm.rank], metadata=meta or None)
            except Exception as e:  # safetensors' own error type: an I/O error here
                raise IoError(f"{files[comm.rank]}: {e}") from e
            if comm.size > 1 and comm.rank == 0:
                total = sum(int(np.prod(s, dtype=np.int64)) * _leaves.numpy_dtype(d).itemsize
                            for s, d in arrays.values())
                index = {"metadata": {"total_size": total},
                         "weight_map": {n: os.path.basename(files[owner[n]]) for n in sorted(arrays)}}
                with open(os.path.join(dst, INDEX), "w") as f:
                    json.dump(index, f, indent=2)
        except Exception as e:
            err = e
        mgr._agree(err)  # every file is written before any rank returns
    return sum(a.nbytes for a in mine.values()), files


# --------------------------------------------------------------------- CLI


def detect(src: str) -> str:
    if os.path.isfile(src) and src.endswith(".safetensors"):
        return "safetensors"
    if not os.path.isdir(src):
        raise NotFoundError(f"{src}: no such file or directory")
    if os.path.isfile(os.path.join(src, ".metadata")):
        return "dcp"
    if os.path.isfile(os.path.join(src, INDEX)) or any(f.endswith(".safetensors") for f in os.listdir(src)):
        return "safetensors"
    if _is_mhckpt_root(src):
        return "mhckpt"
    if is_orbax_step(src) or is_orbax_item(src) or any(
            d.isdigit() and is_orbax_step(os.path.join(src, d)) for d in subdirs(src)):
        return "orbax"
    raise InvalidArgumentError(f"{src}: not an Orbax, DCP, safetensors or mhckpt checkpoint (give --from)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mhckpt convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--from", dest="src_format", choices=("orbax", "dcp", "safetensors", "mhckpt"),
                   help="the source's format (default: found from what SRC holds)")
    p.add_argument("--to", dest="dst_format", choices=("mhckpt", "safetensors"),
                   help="default: safetensors if DST ends in .safetensors or SRC is mhckpt, else mhckpt")
    p.add_argument("--step", type=int, help="the step to write (into mhckpt) or to read (from mhckpt, Orbax)")
    a = p.parse_args(argv)
    from ._mpi import mpi4py_MPI

    MPI = mpi4py_MPI()

    comm = MPI.COMM_WORLD
    src_format = a.src_format or detect(a.src)
    dst_format = a.dst_format or ("safetensors" if a.dst.endswith(".safetensors") or src_format == "mhckpt"
                                  else "mhckpt")
    if dst_format == "safetensors":
        if src_format != "mhckpt":
            raise InvalidArgumentError(
                "safetensors are written from an mhckpt step: convert into mhckpt first")
        nbytes, files = to_safetensors(a.src, a.step, a.dst, comm)
        total = comm.allreduce(nbytes)
        if comm.rank == 0:
            print(f"convert: {a.src} -> {len(files)} safetensors file(s) in {a.dst}: {total} bytes",
                  flush=True)
        return 0
    if src_format == "orbax":
        src: Source = OrbaxSource(a.src, a.step)
    elif src_format == "dcp":
        src = DcpSource(a.src)
    elif src_format == "safetensors":
        src = SafetensorsSource(a.src)
    else:
        raise InvalidArgumentError("mhckpt to mhckpt: nothing to convert")
    step = src.step if src.step is not None and a.step is None else (a.step or 0)
    nbytes = to_mhckpt(src, a.dst, step, comm)
    total = comm.allreduce(nbytes)
    if comm.rank == 0:
        print(f"convert: {a.src} ({src_format}) -> {a.dst} step {step}: {len(src.arrays)} arrays, "
              f"{len(src.values)} values, {total} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
