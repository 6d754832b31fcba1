"""mhckpt.torch: the functional API of ``torch.distributed.checkpoint`` (DCP),
saved and restored by mhckpt.

    import mhckpt.torch as dcp            # instead of: import torch.distributed.checkpoint as dcp

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id="/ckpt/step100")
    ...
    state = {"model": model_sd, "optim": optim_sd}         # of the model to load into
    dcp.load(state, checkpoint_id="/ckpt/step100")          # in place, as DCP does
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

``save``, ``load`` and ``async_save`` take DCP's arguments. A state dict holds
tensors and DTensors (Shard and Replicate placements: FSDP2's ``fully_shard``,
tensor parallel), nested dicts, lists and tuples of them, plain values (None,
bool, int, float, str), and at the top level ``Stateful`` objects (whose
``state_dict()`` is saved and whose ``load_state_dict()`` is called by
``load``). ``load`` fills the tensors in place and sets the plain values, at
any world size and sharding.

``checkpoint_id`` is a directory holding an mhckpt checkpoint root (one
committed step, docs/FORMAT.md), not DCP's files. Saving to it again replaces
what it held once the new save is committed. ``storage_writer``,
``storage_reader`` and ``planner`` raise :class:`mhckpt.UnsupportedError`.

Processes: mpirun starts them, one MPI rank per torch.distributed rank (MPI's
rank i is torch's rank i); every rank of ``process_group`` calls ``save`` and
``load`` in the same order, as with DCP.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Dict, List, Tuple

import torch

from . import _core, _mpi
from ._errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, UnsupportedError
from ._manager import CheckpointManager

__all__ = ["async_save", "load", "save"]

_comms: Dict[Tuple[int, ...], Any] = {}


def _unsupported(feature: str, hint: str = "") -> UnsupportedError:
    return UnsupportedError(f"mhckpt.torch does not support {feature}" + (f": {hint}" if hint else ""))


def _root(checkpoint_id: Any) -> str:
    if checkpoint_id is None:
        raise _unsupported("checkpoint_id=None", "give the checkpoint's directory")
    return os.fspath(checkpoint_id)


def _comm(process_group: Any, no_dist: bool) -> Any:
    """The MPI communicator of the ranks of ``process_group`` (None: MPI's
    world), checked against torch.distributed's ranks."""
    _mpi.ensure_mpi()
    rank, size = _core.rank_and_size(None)
    if no_dist:
        MPI = _mpi.mpi4py_MPI()

        return MPI.COMM_SELF
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if process_group is not None:
            raise FailedPreconditionError(
                "mhckpt.torch: a process_group without torch.distributed initialised")
        return None
    if (dist.get_rank(), dist.get_world_size()) != (rank, size):
        raise FailedPreconditionError(
            f"mhckpt.torch: this process is torch.distributed rank {dist.get_rank()} of "
            f"{dist.get_world_size()} but MPI rank {rank} of {size}; start the job with mpirun so "
            "that the two agree"
        )
    if process_group is None:
        return None
    ranks = tuple(dist.get_process_group_ranks(process_group))
    if ranks == tuple(range(size)):
        return None
    if ranks not in _comms:
        MPI = _mpi.mpi4py_MPI()

        world = MPI.COMM_WORLD
        _comms[ranks] = world.Create_group(world.group.Incl(list(ranks)))
    return _comms[ranks]


def _check(storage: Any, planner: Any, storage_name: str) -> None:
    if storage is not None:
        raise _unsupported(f"{storage_name}=...", "mhckpt writes its own format to checkpoint_id")
    if planner is not None:
        raise _unsupported("planner=...", "mhckpt plans the writes and reads itself")


def _is_stateful(x: Any) -> bool:
    return callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None)) \
        and not isinstance(x, torch.Tensor)


def _resolve(state_dict: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """The state dict with each top-level Stateful replaced by its
    ``state_dict()``, and the keys of those."""
    if not isinstance(state_dict, dict):
        raise InvalidArgumentError(f"state_dict must be a dict, not {type(state_dict).__qualname__}")
    out, statefuls = {}, []
    for k, v in state_dict.items():
        if _is_stateful(v):
            out[k] = v.state_dict()
            statefuls.append(k)
        else:
            out[k] = v
    return out, statefuls


def _next_step(mgr: CheckpointManager) -> int:
    latest = mgr.latest_step()
    return 0 if latest is None else latest + 1


def _start_save(state_dict: Dict[str, Any], checkpoint_id: Any, process_group: Any, no_dist: bool,
                async_save: bool) -> CheckpointManager:
    root = _root(checkpoint_id)
    sd, _ = _resolve(state_dict)
    # max_to_keep=1: the step before goes once the new one is committed.
    # A manager per checkpoint_id: the staging memory goes on from one to the
    # next, so that each save copies into touched memory.
    mgr = CheckpointManager(root, _comm(process_group, no_dist), max_to_keep=1, async_save=async_save,
                            carry_staging_over=True)
    try:
        mgr.save(_next_step(mgr), sd)
    except BaseException:
        mgr.close()
        raise
    return mgr


def save(state_dict: Dict[str, Any], *, checkpoint_id: Any = None, storage_writer: Any = None,
         planner: Any = None, process_group: Any = None, no_dist: bool = False,
         use_collectives: bool = True) -> None:
    """Saves ``state_dict`` into the directory ``checkpoint_id`` and returns
    once it is committed (collective over ``process_group``; ``no_dist``:
    this process alone). Raises mhckpt.Error, the same on every rank."""
    _check(storage_writer, planner, "storage_writer")
    mgr = _start_save(state_dict, checkpoint_id, process_group, no_dist, async_save=False)
    try:
        mgr.wait_until_finished()
    finally:
        mgr.close()


def async_save(state_dict: Dict[str, Any], *, checkpoint_id: Any = None, storage_writer: Any = None,
               planner: Any = None, process_group: Any = None, async_checkpointer_type: Any = None,
               async_stager: Any = None, no_dist: bool = False,
               use_collectives: bool = True) -> concurrent.futures.Future:
    """Starts saving ``state_dict`` and returns a ``concurrent.futures.Future``
    once every local tensor is copied into mhckpt's memory: the tensors may be
    changed at once. The future's ``result()`` is None once the save is
    committed, or raises its mhckpt.Error."""
    _check(storage_writer, planner, "storage_writer")
    if async_stager is not None:
        raise _unsupported("async_stager=...", "mhckpt copies the tensors itself before async_save returns")
    kind = getattr(async_checkpointer_type, "value", async_checkpointer_type)
    if kind not in (None, "thread"):
        raise _unsupported(f"async_checkpointer_type={async_checkpointer_type!r}",
                           "the commit runs on a background thread")
    mgr = _start_save(state_dict, checkpoint_id, process_group, no_dist, async_save=True)
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()

    def finish() -> None:
        try:
            mgr.wait_until_finished()
        except BaseException as e:  # handed to the future
            mgr.close()
            future.set_exception(e)
            return
        mgr.close()
        future.set_result(None)

    # Not a daemon: the interpreter joins it before its exit handlers run, so a
    # save still pending at exit commits and closes its manager first.
    threading.Thread(target=finish, name="mhckpt-torch-async-save").start()
    return future


def load(state_dict: Dict[str, Any], *, checkpoint_id: Any = None, storage_reader: Any = None,
         planner: Any = None, process_group: Any = None, no_dist: bool = False) -> None:
    """Loads the checkpoint in ``checkpoint_id`` into ``state_dict`` in place:
    tensors and DTensors are filled (at any world size and sharding), plain
    values are set, and top-level Stateful objects get ``load_state_dict``.
    Every key of ``state_dict`` must be in the checkpoint (NotFoundError
    otherwise); the checkpoint may hold more. Collective."""
    _check(storage_reader, planner, "storage_reader")
    root = _root(checkpoint_id)
    if not os.path.isdir(root):
        raise NotFoundError(f"mhckpt.torch.load: no checkpoint at {root}")
    sd, statefuls = _resolve(state_dict)
    with CheckpointManager(root, _comm(process_group, no_dist), own_root=False) as mgr:
        step = mgr.latest_step()
        if step is None:
            hint = ""
            if os.path.isfile(os.path.join(root, ".metadata")):
                hint = (": it holds a DCP checkpoint, which mhckpt.torch does not read; convert it with "
                        f"`python -m mhckpt convert {root} NEW_DIRECTORY`")
            raise NotFoundError(f"mhckpt.torch.load: {root} holds no committed checkpoint{hint}")
        restored = mgr.restore(step, sd)
    _assign(sd, restored)
    for k in statefuls:
        state_dict[k].load_state_dict(sd[k])
    for k, v in sd.items():
        if k not in statefuls:
            state_dict[k] = v


def _assign(dst: Any, src: Any) -> None:
    """Copies the restored plain values of ``src`` into the containers of
    ``dst`` (the tensors of ``src`` are those of ``dst``, filled in place)."""
    if isinstance(dst, dict):
        keys = list(dst.keys())
    elif isinstance(dst, list):
        keys = range(len(dst))
    else:
        return
    for k in keys:
        d, s = dst[k], src[k]
        if s is d:
            continue
        if isinstance(d, (dict, list)) and type(s) is type(d):
            _assign(d, s)
        else:
            dst[k] = s
