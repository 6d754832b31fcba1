"""``python -m mhckpt COMMAND``: ``convert SRC DST`` (see mhckpt/_convert.py).

Run it under mpirun at any process count: ``mpirun -np 4 python -m mhckpt
convert /orbax/run1/1000 /ckpt/run1``.
"""
from __future__ import annotations

import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "convert":
        from ._convert import main as convert
        from ._errors import Error

        try:
            return convert(rest)
        except (Error, OSError, ImportError) as e:
            # The same on every rank (a failed read is agreed before the save).
            print(f"python -m mhckpt convert: {e}", file=sys.stderr, flush=True)
            return 1
    print(f"python -m mhckpt: unknown command {command!r} (commands: convert)", file=sys.stderr)
    return 2


def _exit(rc: int) -> None:
    """Ends the process at once once the command is done: closes what is
    still open, finalizes MPI, flushes, and skips the interpreter's teardown
    of the modules (torch's and jax's take most of a second; everything the
    command wrote is durable by now)."""
    try:
        from ._mpi import open_managers

        for mgr in list(open_managers):
            mgr.close()
        if "mpi4py.MPI" in sys.modules:
            from mpi4py import MPI

            if MPI.Is_initialized() and not MPI.Is_finalized():
                MPI.Finalize()
        else:
            from . import _core

            if _core.mpi_initialized() and not _core.mpi_finalized():
                _core.finalize_mpi()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


if __name__ == "__main__":
    _exit(main())
