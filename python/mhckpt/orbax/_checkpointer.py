"""Orbax's checkpointers: ``Checkpointer`` and ``AsyncCheckpointer`` (one
item in a directory of its own), ``PyTreeCheckpointer`` and
``StandardCheckpointer``."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, List, Optional

from .._errors import NotFoundError
from .._manager import CheckpointManager as _Manager
from ._common import DEFAULT_ITEM_NAME, unsupported
from ._handlers import PyTreeCheckpointHandler, StandardCheckpointHandler, kind_of
from ._store import Store


class Checkpointer:
    """``Checkpointer(handler)``: saves one item into a directory of its own
    (``save(directory, item)`` or ``save(directory, args=...)``) and restores
    it (``restore(directory, target)`` or ``restore(directory, args=...)``);
    collective. As an argument of CheckpointManager, the kind of an item.
    ``comm``: an mpi4py communicator (default: MPI's world); not in Orbax.

    The directory holds an mhckpt checkpoint root. ``save`` into a directory
    that holds a checkpoint raises ValueError unless ``force=True``, which
    replaces it once the new save is committed."""

    is_async = False

    def __init__(self, handler: Any = None, *a, comm: Any = None, **k):
        if a or k:
            raise unsupported(f"{type(self).__name__} options {list(k) or list(a)}")
        self.handler = handler if handler is not None else self._default_handler()
        kind_of(self.handler)
        self._comm = comm
        self._open: List[_Manager] = []  # saves of an AsyncCheckpointer not waited for yet

    @staticmethod
    def _default_handler():
        return PyTreeCheckpointHandler()

    def _kind(self, a: Any) -> str:
        return kind_of(a) if a is not None else kind_of(self.handler)

    def save(self, directory: Any, *a, force: bool = False, custom_metadata: Any = None, args: Any = None,
             **k) -> None:
        if custom_metadata is not None:
            raise unsupported(f"{type(self).__name__}.save(custom_metadata=...)")
        if args is not None:
            if a or k:
                raise ValueError("give either args or an item, not both")
            if isinstance(args, Mapping):
                raise unsupported(f"{type(self).__name__}.save(args=Composite(...))",
                                  "a CheckpointManager saves Composite items")
            item, save_args = args.item, getattr(args, "save_args", None)
        else:
            if len(a) > 1:
                raise TypeError(f"save takes the directory and one item, not {1 + len(a)} arguments")
            item = a[0] if a else k.pop("item", None)
            save_args = k.pop("save_args", None)
            if k:
                raise unsupported(f"{type(self).__name__}.save({', '.join(sorted(k))}=...)")
        kind = self._kind(args)
        self.wait_until_finished()
        root = os.fspath(directory)
        mgr = _Manager(root, self._comm, max_to_keep=1, async_save=self.is_async)
        try:
            latest = mgr.latest_step()
            if latest is not None and not force:
                raise ValueError(f"Destination {root} already exists. To overwrite, set force=True.")
            step = 0 if latest is None else latest + 1
            Store(mgr).save(step, {DEFAULT_ITEM_NAME: (kind, item, save_args)}, True)
        except BaseException:
            mgr.close()
            raise
        if self.is_async:
            self._open.append(mgr)
            return
        try:
            mgr.wait_until_finished()
        finally:
            mgr.close()

    def restore(self, directory: Any, *a, args: Any = None, **k) -> Any:
        if args is not None:
            if a or k:
                raise ValueError("give either args or a target, not both")
            if isinstance(args, Mapping):
                raise unsupported(f"{type(self).__name__}.restore(args=Composite(...))",
                                  "a CheckpointManager restores Composite items")
            target = getattr(args, "item", None)
            restore_args = getattr(args, "restore_args", None)
            partial = bool(getattr(args, "partial_restore", False))
        else:
            if len(a) > 1:
                raise TypeError(f"restore takes the directory and one target, not {1 + len(a)} arguments")
            target = a[0] if a else k.pop("item", k.pop("target", None))
            restore_args = k.pop("restore_args", None)
            partial = False
            if k:
                raise unsupported(f"{type(self).__name__}.restore({', '.join(sorted(k))}=...)")
        self.wait_until_finished()
        root = os.fspath(directory)
        if not os.path.isdir(root):
            raise NotFoundError(f"{root}: no checkpoint")
        with _Manager(root, self._comm, own_root=False) as mgr:
            step = mgr.latest_step()
            if step is None:
                raise NotFoundError(f"{root}: no committed checkpoint")
            store = Store(mgr)
            _, saved, single = store.layout(step)
            if not single:
                raise ValueError(
                    f"{root} holds the items {sorted(saved)}: restore it with a CheckpointManager")
            name = "" if "" in saved else DEFAULT_ITEM_NAME
            return store.restore(step, {name: (target, restore_args, partial)})[name]

    def wait_until_finished(self) -> None:
        """Waits for this checkpointer's background saves; raises the first failure."""
        first: Optional[BaseException] = None
        while self._open:
            mgr = self._open.pop(0)
            try:
                mgr.wait_until_finished()
            except BaseException as e:  # every manager is closed before it is raised
                first = first or e
            finally:
                mgr.close()
        if first is not None:
            raise first

    def close(self) -> None:
        self.wait_until_finished()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


class AsyncCheckpointer(Checkpointer):
    """``AsyncCheckpointer(handler, timeout_secs=None)``: as an argument of
    CheckpointManager, the manager commits in the background."""

    is_async = True

    def __init__(self, handler: Any, timeout_secs: Optional[int] = None, *, comm: Any = None, **k):
        super().__init__(handler, comm=comm, **k)
        self.timeout_secs = timeout_secs


class PyTreeCheckpointer(Checkpointer):
    """``Checkpointer(PyTreeCheckpointHandler())``."""

    def __init__(self, **k):
        super().__init__(PyTreeCheckpointHandler(), **k)


class StandardCheckpointer(AsyncCheckpointer):
    """``AsyncCheckpointer(StandardCheckpointHandler())``."""

    def __init__(self, **k):
        super().__init__(StandardCheckpointHandler(), **k)
