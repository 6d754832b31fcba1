"""MPI for the managers: initialised at the first one (unless someone has),
the managers a program leaves open closed at exit while MPI still runs, and
MPI finalized then if this package initialised it."""
from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Optional

from . import _core

# Every open mhckpt.CheckpointManager (each adds itself, and leaves at close).
open_managers: "weakref.WeakSet[Any]" = weakref.WeakSet()
_mpi_owned = False  # this package called MPI_Init_thread, so it calls MPI_Finalize
_exit_hook = threading.Lock()
_exit_hook_registered = False


def _at_exit() -> None:
    # Close what the program left open while MPI still runs, then finalize
    # MPI if this package initialised it. Registered after mpi4py's own hook
    # (at the first manager), so it runs before mpi4py finalizes.
    for mgr in list(open_managers):
        mgr.close()
    if _mpi_owned:
        _core.finalize_mpi()


def ensure_mpi() -> None:
    """Initialises MPI (``MPI_THREAD_MULTIPLE``) unless it is, and registers
    the exit hook above once."""
    global _mpi_owned, _exit_hook_registered
    with _exit_hook:
        if _core.init_mpi():
            _mpi_owned = True
        if not _exit_hook_registered:
            atexit.register(_at_exit)
            _exit_hook_registered = True


MPI4PY_HINT = 'mpi4py is needed here: pip install "mhckpt[mpi]" (or: pip install mpi4py)'


def mpi4py_MPI() -> Any:
    """mpi4py's ``MPI`` module, or an ImportError that says how to install it
    (the same on every rank: each process has the same packages)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(f"{MPI4PY_HINT} ({e})", name="mpi4py") from e
    return MPI


def comm_handle(comm: Any) -> Optional[int]:
    """The MPI_Comm handle of an mpi4py communicator (None: MPI's world)."""
    if comm is None:
        return None
    handle = getattr(comm, "handle", None)
    if not isinstance(handle, int):
        raise TypeError(
            f"comm must be an mpi4py communicator or None, not {type(comm).__qualname__}"
        )
    return handle
