"""The restoring half of ``mhckpt.CheckpointManager``: ``restore``,
``restore_latest`` and ``verify``.

``Restoring`` is a mixin of :class:`mhckpt.CheckpointManager`, which supplies
``_impl`` (the C++ manager), ``_root``, ``_call_agreed``, ``all_steps`` and
``describe``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import _leaves, _pytree
from ._errors import DataLossError, NotFoundError
from ._plan import plan_restore


class Restoring:
    """Restoring methods of :class:`mhckpt.CheckpointManager`."""

    _impl: Any
    _root: str

    def restore(
        self,
        step: int,
        target: Any = None,
        *,
        strict: bool = False,
        verify_checksums: bool = True,
        read_once: bool = True,
        prefault: bool = True,
        direct_reads: bool = True,
        source: str = "any",
    ) -> Any:
        """Restores committed step ``step`` into the structure of ``target``.

        Any world size and any sharding: each rank reads the boxes its target
        leaves ask for.

        Args:
          step: a committed step (see :meth:`latest_step`).
          target: a pytree like the saved state. Its leaves say what to build:
            a numpy array or :class:`mhckpt.Shard` (filled in place), a
            ``jax.Array`` or ``jax.ShapeDtypeStruct`` with a sharding (a new
            ``jax.Array`` with that sharding), a ``torch.Tensor`` or
            ``DTensor`` (filled in place), any other leaf (a new numpy array,
            or the saved value for a non-array leaf). None: every array as a
            whole numpy array and every value, in nested dicts by name.
          strict: raise unless the target names exactly the saved arrays.
          verify_checksums: check every byte returned against the commit
            marker's checksums (at any world size); False skips the checks.
          read_once: a box several ranks ask for (a replicated array, a shard
            held by every data-parallel copy) is read from storage by one of
            them and sent to the others; False: each rank reads its own
            (off everywhere if off on any rank).
          prefault: a second thread per rank faults in the pages of the
            arrays ahead of the reads into them, so that the kernel's work on
            new memory runs beside the copy out of the page cache; False:
            the reading thread faults them itself.
          direct_reads: long runs are read with O_DIRECT straight into
            destinations that line up with the file (the arrays this method
            makes are page-aligned; a numpy array or tensor of yours lines
            up if its data starts on a 512-byte boundary, or 4 KiB on some
            file systems), several reads in flight, unless the page cache
            holds them; False: every read goes through the page cache.
          source: which tier to read: "any" (the local tier if it holds the
            step, else ``root``), "local" or "persistent".

        Returns a new pytree with ``target``'s structure.

        Raises (the same on every rank): NotFoundError (step not committed, a
        key not in the checkpoint), InvalidArgumentError (a target whose
        shape or dtype differs from the saved one, naming the key),
        DataLossError (damaged data, naming array and box), IoError.
        """
        step = int(step)
        err: Optional[BaseException] = None
        plans: List[Any] = []
        names: List[Optional[str]] = []
        values: Dict[str, Any] = {}
        treedef = None
        try:
            desc = self.describe(step)
            treedef, plans, names = plan_restore(desc, target, strict, step)
            values = desc["values"]
        except Exception as e:  # agreed by the C++ core, raised on every rank
            err, plans = e, []
        specs = [p.spec() for p in plans if p is not None]
        self._call_agreed(
            err,
            self._impl.restore,
            step,
            specs,
            strict,
            verify_checksums,
            read_once,
            bool(prefault),
            bool(direct_reads),
            str(source),
        )
        out = [p.finish() if p is not None else values[n] for p, n in zip(plans, names)]
        return _pytree.unflatten(treedef, out)

    def restore_latest(
        self,
        target: Any = None,
        *,
        strict: bool = False,
        read_once: bool = True,
        prefault: bool = True,
        direct_reads: bool = True,
        source: str = "any",
    ) -> Tuple[int, Any]:
        """Restores the newest committed step that restores intact, into the
        structure of ``target``, and returns ``(step, tree)``.

        The committed steps are tried newest first, the local tier before
        ``root`` for a step both hold; a damaged piece of a local step is
        served from another node's copy or rebuilt from parity, and a step
        that still cannot be served whole (damaged bytes or marker, a lost
        piece) is skipped with one log line naming the step, the tier and
        why -- the same choice on every rank. Every byte is checked. For a
        job restarted after a crash: ``latest_step`` names the newest
        committed step, which may be damaged; this restores the newest one
        that is not.

        The destinations are made from the newest step this rank can
        describe, so ``target`` (as for :meth:`restore`) must fit every step
        tried: the steps of one run hold the same arrays. A step that does not
        hold them is raised, not skipped. Non-array leaves come from the step
        restored.

        Args: as :meth:`restore` (``source`` limits the steps tried to one
        tier: "local" or "persistent").

        Raises (the same on every rank): NotFoundError if no committed step
        restores (naming each step skipped and why), or a target key a step
        lacks; InvalidArgumentError (a target that does not fit a step);
        IoError (``root`` cannot be listed or read).
        """
        err: Optional[BaseException] = None
        plans: List[Any] = []
        names: List[Optional[str]] = []
        treedef = None
        try:
            desc = None
            for s in sorted(self.all_steps(), reverse=True):
                try:
                    desc = self.describe(s)
                    break
                except (NotFoundError, DataLossError):
                    continue
            if desc is None:
                raise NotFoundError(f"no committed step in '{self._root}' can be described")
            treedef, plans, names = plan_restore(desc, target, strict, desc["step"])
        except Exception as e:  # agreed by the C++ core, raised on every rank
            err, plans = e, []
        specs = [p.spec() for p in plans if p is not None]
        step = self._call_agreed(
            err,
            self._impl.restore_latest,
            specs,
            strict,
            read_once,
            bool(prefault),
            bool(direct_reads),
            str(source),
        )
        values = self.describe(step)["values"] if any(n is not None for n in names) else {}
        for n in names:
            if n is not None and n not in values:
                raise _leaves.not_found(n, step)
        out = [p.finish() if p is not None else values[n] for p, n in zip(plans, names)]
        return step, _pytree.unflatten(treedef, out)

    def verify(self, step: int) -> int:
        """Re-reads every byte of committed step ``step`` and checks it
        against the checksums in its marker. Returns the bytes checked (all
        ranks). Raises DataLossError naming the array and box of the first
        damage, NotFoundError if the step is not committed."""
        return self._impl.verify(int(step))
