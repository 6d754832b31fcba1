"""mhckpt.orbax: Orbax's checkpointing API, saved and restored by mhckpt.

    import mhckpt.orbax as ocp            # instead of: import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=100)
    with ocp.CheckpointManager("/ckpt/run1", options=options) as mngr:
        mngr.save(step, args=ocp.args.StandardSave(state))
        ...
        state = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(abstract_state))

The older style, ``CheckpointManager(directory, ocp.AsyncCheckpointer(
ocp.PyTreeCheckpointHandler()), options)`` with ``save(step, items,
save_kwargs={'save_args': save_args})`` and ``restore(step, items=target,
restore_kwargs={'restore_args': ...})``, works too. ``SaveArgs(aggregate=True)``
is honoured like every other leaf: ``save`` returns once each local buffer is
copied into mhckpt's memory, so the arrays may be donated at once (no "Array
has been deleted" in a background writer).

The checkpoints are mhckpt's own (one directory per step under
``directory``; docs/FORMAT.md), not Orbax's files. Every Orbax argument that
would change what is stored or read and that mhckpt does not provide raises
:class:`mhckpt.UnsupportedError` naming it; none is ignored. See
docs/PYTHON.md, "Coming from Orbax".

Processes: the job runs under mpirun, one MPI rank per JAX process (MPI's
rank i is ``jax.process_index()`` i); the manager's collective calls are
made by every process in the same order, as with Orbax.
"""
from __future__ import annotations

# The modules: _options (CheckpointManagerOptions), checkpoint_managers (the
# save decision policies), _retention (the steps kept: max_to_keep, best_fn), _handlers (SaveArgs,
# RestoreArgs, the handlers), _trees (pytree helpers), _store (the items of a
# step in mhckpt and the metadata recording them), _checkpointer (the
# checkpointers), _checkpoint_manager (CheckpointManager). Names importable
# from here that are not in __all__ stay so (the errors, DEFAULT_ITEM_NAME).
from .._errors import InvalidArgumentError, NotFoundError, UnsupportedError  # noqa: F401
from . import args, checkpoint_managers, checkpoint_utils
from ._checkpoint_manager import CheckpointManager, StepAlreadyExistsError
from ._checkpointer import AsyncCheckpointer, Checkpointer, PyTreeCheckpointer, StandardCheckpointer
from ._common import DEFAULT_ITEM_NAME, unsupported  # noqa: F401
from ._handlers import (
    ArrayRestoreArgs,
    JsonCheckpointHandler,
    PyTreeCheckpointHandler,
    RestoreArgs,
    SaveArgs,
    StandardCheckpointHandler,
)
from ._options import AsyncOptions, CheckpointManagerOptions, MultiprocessingOptions
from .args import Composite

__all__ = [
    "ArrayRestoreArgs",
    "AsyncCheckpointer",
    "AsyncOptions",
    "CheckpointManager",
    "CheckpointManagerOptions",
    "Checkpointer",
    "Composite",
    "JsonCheckpointHandler",
    "MultiprocessingOptions",
    "PyTreeCheckpointHandler",
    "PyTreeCheckpointer",
    "RestoreArgs",
    "SaveArgs",
    "StandardCheckpointHandler",
    "StandardCheckpointer",
    "StepAlreadyExistsError",
    "UnsupportedError",
    "args",
    "checkpoint_managers",
    "checkpoint_utils",
]
