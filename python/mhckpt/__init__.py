"""mhckpt: asynchronous, multi-host checkpoints of JAX, PyTorch and numpy state.

    import mhckpt
    with mhckpt.CheckpointManager("/ckpt", max_to_keep=3) as mgr:
        mgr.save(step, {"params": params, "opt": opt_state, "data": {"pos": pos}})
        ...                      # donate / overwrite the arrays at once
        state = mgr.restore(mgr.latest_step(), target)

Every method is collective over the manager's MPI communicator unless its
docstring says "local". jax and torch are imported only when a leaf of
theirs is saved or restored. See docs/PYTHON.md.

Drop-ins for code written against other checkpointers: ``mhckpt.orbax``
(Orbax's CheckpointManager API) and ``mhckpt.torch`` (DCP's save, load and
async_save). ``python -m mhckpt convert SRC DST`` converts Orbax, DCP and
safetensors checkpoints into mhckpt, and mhckpt steps into safetensors.
"""
from ._errors import (
    AlreadyExistsError,
    DataLossError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    IoError,
    NotFoundError,
    UnsupportedError,
)
from ._arrays import new_array as empty
from ._manager import CheckpointManager
from ._saving import SaveFence
from ._preemption import clear_preemption_notice, notify_preemption
from ._shard import Shard

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "CheckpointManager",
    "DataLossError",
    "Error",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "IoError",
    "NotFoundError",
    "SaveFence",
    "Shard",
    "UnsupportedError",
    "clear_preemption_notice",
    "empty",
    "notify_preemption",
]
