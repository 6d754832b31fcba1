"""Orbax's ``CheckpointManager`` on an mhckpt checkpoint root."""
from __future__ import annotations

import logging
import os
import pathlib
import signal
import time
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence, Set

from .._errors import NotFoundError
from .._manager import CheckpointManager as _Manager
from ._checkpointer import Checkpointer
from ._common import DEFAULT_ITEM_NAME, unsupported
from ._handlers import kind_of
from ._metadata import RootMetadata, step_metadata
from ._options import check_options
from ._retention import kept, metric_value, ranked
from ._store import BEST_KEY, METRICS_KEY, Store
from .args import Composite
from .checkpoint_managers import Facts, compile_policy, default_policy


class StepAlreadyExistsError(ValueError):
    """``save`` of a step that is already committed (Orbax's error)."""


class CheckpointManager:
    """Orbax's ``CheckpointManager`` on an mhckpt checkpoint root.

    Args:
      directory: the checkpoint root, on a file system every process sees.
      checkpointers: the older style: one ``Checkpointer``/``AsyncCheckpointer``
        (one item), or a dict of them by item name. An AsyncCheckpointer (or
        ``options.enable_async_checkpointing``) commits in the background.
      options: a :class:`CheckpointManagerOptions` (ours or Orbax's).
      item_names: the names of the items a step holds (then ``save`` takes
        ``args.Composite``).
      comm: an mpi4py communicator (default: MPI's world); not in Orbax.
      preemption_signals: the signals that are preemption notices for
        :meth:`reached_preemption` while the manager is open (default
        SIGTERM, the one JAX's preemption service listens to; Slurm's
        ``--signal=USR1@60`` wants SIGUSR1 here). Their handlers in place
        before are not called meanwhile, except one the program set with
        ``signal.signal``, which is called after the notice is recorded
        (:class:`mhckpt.CheckpointManager`'s ``preemption``). None or ():
        no handler; notices come from :func:`mhckpt.notify_preemption`
        only. Not in Orbax.
      preemption_grace_seconds: the scheduler's grace period, recorded with
        the preemption step (0: unknown). Not in Orbax.

    ``metadata``, ``item_handlers``, ``logger`` and ``handler_registry``
    raise UnsupportedError when given.
    """

    def __init__(self, directory: Any, checkpointers: Any = None, options: Any = None, metadata: Any = None,
                 item_names: Optional[Sequence[str]] = None, item_handlers: Any = None, logger: Any = None,
                 handler_registry: Any = None, *, comm: Any = None,
                 preemption_signals: Any = (signal.SIGTERM,), preemption_grace_seconds: float = 0.0):
        for arg, v in (("metadata", metadata), ("item_handlers", item_handlers), ("logger", logger),
                       ("handler_registry", handler_registry)):
            if v is not None:
                raise unsupported(f"CheckpointManager({arg}=...)")
        self._options = o = check_options(options)
        self._directory = pathlib.Path(os.fspath(directory))
        if not o.create and not self._directory.exists():
            raise FileNotFoundError(
                f"{self._directory} does not exist (CheckpointManagerOptions(create=False))")
        self._legacy: Optional[Dict[str, Checkpointer]] = None
        self._single: Optional[bool] = None
        async_save = bool(o.enable_async_checkpointing)
        if checkpointers is not None:
            if isinstance(checkpointers, Mapping):
                self._legacy = dict(checkpointers)
                self._single = False
            else:
                self._legacy = {DEFAULT_ITEM_NAME: checkpointers}
                self._single = True
            for c in self._legacy.values():
                kind_of(c)
            async_save = any(getattr(c, "is_async", type(c).__name__ == "AsyncCheckpointer")
                             for c in self._legacy.values())
        if item_names is not None:
            if self._legacy is not None:
                raise ValueError("give either checkpointers or item_names, not both")
            self._single = False
            self._item_names = tuple(item_names)
        else:
            self._item_names = None
        timeout = o.async_options.timeout_secs if o.async_options is not None else 3600.0
        # Whole seconds, as Orbax's EveryNSeconds takes them.
        self._interval = int(o.keep_time_interval.total_seconds()) if o.keep_time_interval else 0
        if o.save_decision_policy is not None:
            self._decide, continuous = compile_policy(o.save_decision_policy)
        else:
            self._decide = default_policy(o.save_interval_steps, o.save_on_steps, o.should_save_fn)
            continuous = None
        signals = tuple(preemption_signals or ())
        self._mgr = _Manager(
            str(self._directory), comm, max_to_keep=o.max_to_keep or 0, keep_period=o.keep_period or 0,
            keep_time_interval_seconds=float(self._interval),
            async_save=async_save, own_root=not o.read_only, collective_timeout_seconds=float(timeout),
            preemption=bool(signals), preemption_signals=signals,
            preemption_grace_seconds=float(preemption_grace_seconds),
            save_continuously=continuous is not None, min_save_interval_seconds=continuous or 0.0,
            best_metric=BEST_KEY if o.best_fn is not None else None, best_mode=o.best_mode,
            keep_without_metric=bool(o.keep_checkpoints_without_metrics),
        )
        self._store = Store(self._mgr)
        self._pending: Set[int] = set()  # steps saved, until they are seen committed
        # Steps the retention policy drops (decided at save, as Orbax does;
        # the core deletes them once that save is committed): not listed.
        self._dropped: Set[int] = set()
        self._best: Dict[int, Optional[float]] = {}  # step -> best_fn value (BEST_KEY), read once
        self._times: Dict[int, float] = {}  # step -> creation time (s), read once
        self._preemption_step: Optional[int] = None  # the agreed one, once reached

    # --------------------------------------------------------------- catalogue

    @property
    def directory(self) -> pathlib.Path:
        return self._directory

    def all_steps(self, read: bool = False) -> List[int]:
        """The committed steps, and the one being saved in the background,
        less those that the retention policy dropped at a save (Orbax's
        catalogue; mhckpt deletes them once that save is committed)."""
        committed = set(self._mgr.all_steps())
        self._pending -= committed
        steps = committed | self._pending
        self._dropped &= steps  # those already deleted are gone from the listing too
        return sorted(steps - self._dropped)

    def latest_step(self) -> Optional[int]:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def reload(self) -> None:
        """Nothing to do: the steps are read from the directory at each call."""

    def best_step(self) -> Optional[int]:
        """The best step by ``options.best_fn`` among the steps that have
        metrics (between equal values the later step), as Orbax ranks them;
        None if none has. Without ``best_fn``: :meth:`latest_step`. A step's
        value is ``best_fn(metrics)`` as computed when it was saved (stored
        with it). Local."""
        if self._options.best_fn is None:
            return self.latest_step()
        steps = self.all_steps()
        best = ranked(steps, self._best_values(steps), self._options.best_mode)
        return best[-1] if best else None

    def delete(self, step: int) -> None:
        """Deletes step ``step`` (waiting for saves in progress first).
        Collective: every process calls it with the same step. Raises
        FileNotFoundError, on every process, if the step does not exist. A
        read-only manager deletes nothing (a warning, as Orbax)."""
        step = int(step)
        if self._options.read_only:
            logging.getLogger(__name__).warning("%s is read only, delete will be skipped", self._directory)
            return
        try:
            # A step that retention dropped may still be on disk: gone for Orbax.
            self._mgr._agree(NotFoundError(f"step {step}") if step in self._dropped else None)
            try:
                self._mgr.delete(step)
            finally:
                self._pending.clear()  # delete waited for the saves in progress
        except NotFoundError:
            raise FileNotFoundError(f"Requested deleting a non-existent step: {step}.") from None
        self._best.pop(step, None)
        self._times.pop(step, None)

    def _best_values(self, steps: List[int]) -> Dict[int, Optional[float]]:
        """{step: its best_fn value, or None}, read from the steps' markers once."""
        values: Dict[int, Optional[float]] = {}
        for s in steps:
            if s not in self._best:
                try:
                    self._best[s] = metric_value(self._mgr.describe(s)["metadata"].get(BEST_KEY))
                except NotFoundError:  # deleted since it was listed
                    values[s] = None
                    continue
            values[s] = self._best[s]
        return values

    def should_save(self, step: int) -> bool:
        """True if ``step`` is newer than the latest step and the options'
        policy asks for it: ``save_decision_policy``, or else Orbax's default
        one (``should_save_fn``; or ``save_interval_steps``,
        ``save_on_steps``, or no step saved yet), and, unless a
        ``save_decision_policy`` leaves it out, the preemption step
        (:meth:`reached_preemption`).

        Collective, as Orbax's with a preemption service or a continuous
        policy: every process calls it (or ``save``, which calls it, or
        :meth:`reached_preemption`) with the same step, once per step or
        more; the answer is the same on every process."""
        if self._options.read_only:
            return False
        step = int(step)
        continuous = self._mgr.should_save(step)  # the step's round, on every process
        preemption = self.reached_preemption(step)
        last = self.latest_step()
        if last is not None and last >= step:
            return False
        return self._decide(Facts(step=step, last=last, preemption=preemption, continuous=continuous))

    def reached_preemption(self, step: int) -> bool:
        """True at the step every process agrees to save at after a
        preemption notice on any of them (a signal of ``preemption_signals``,
        or :func:`mhckpt.notify_preemption`), as JAX's preemption sync point:
        at that step only. The loop saves it (``should_save`` is True there)
        and exits::

            for step in range(start, steps):
                state = train_step(state)
                mngr.save(step, args=ocp.args.StandardSave(state))
                if mngr.reached_preemption(step):
                    mngr.wait_until_finished()
                    break

        Collective: every process calls it (or ``should_save``, or ``save``)
        with the same step, in order. It does not block: a notice that
        arrives during step s is agreed at step s+1 or s+2
        (:meth:`mhckpt.CheckpointManager.reached_preemption`)."""
        step = int(step)
        reached = self._mgr.reached_preemption(step)
        if reached and self._preemption_step is None:
            self._preemption_step = step
        return reached and step == self._preemption_step

    def is_saving_in_progress(self) -> bool:
        """Whether a save started is still being written (local): its step
        is not yet committed in the directory. A save that failed counts as
        in progress until :meth:`wait_until_finished` raises its failure; one
        whose step the retention policy dropped at once (best_fn) does not."""
        return bool(set(self.all_steps()) & self._pending)

    # ------------------------------------------------------------------ saving

    def save(self, step: int, items: Any = None, save_kwargs: Any = None, metrics: Any = None,
             force: Optional[bool] = False, args: Any = None, custom_metadata: Any = None) -> bool:
        """Saves ``args`` (or the older ``items`` with ``save_kwargs``) as
        step ``step`` if :meth:`should_save` (or ``force``) says so; returns
        whether it did. Returns once every local buffer is copied: arrays may
        be donated or deleted at once. Raises StepAlreadyExistsError for a
        committed step."""
        if custom_metadata is not None:
            raise unsupported("CheckpointManager.save(custom_metadata=...)",
                              "save it as a JSON item (args.Composite(..., meta=args.JsonSave(...)))")
        step = int(step)
        if self._options.read_only:
            return False
        if not force and not self.should_save(step):
            return False
        if self._interval and self._pending:
            # keep_time_interval decides by commit times, the core's as
            # its markers hold them: the previous save's must be known.
            self.wait_until_finished()
        steps = self.all_steps()  # before the save: its retention may run before save returns
        if step in steps:
            raise StepAlreadyExistsError(f"Checkpoint for step {step} already exists.")
        request, single = self._save_request(items, save_kwargs, args)
        best = None
        if self._options.best_fn is not None and metrics is not None:
            best = metric_value(float(self._options.best_fn(metrics)))
        if self._options.prevent_write_metrics:
            metrics = None
        self._store.save(step, request, single, metrics, best)
        self._best[step] = best
        self._dropped.discard(step)
        self._drop_old_steps(steps + [step])
        self._pending.add(step)
        return True

    def _drop_old_steps(self, steps: List[int]) -> None:
        """What Orbax does once a save has started: the steps its retention
        policy no longer keeps leave the catalogue (the newest one too, if
        it is not among the best)."""
        o = self._options
        values = self._best_values(steps) if o.best_fn is not None else None
        times = self._step_times(steps) if self._interval else None
        self._dropped |= set(steps) - kept(steps, values, max_to_keep=o.max_to_keep, keep_period=o.keep_period,
                                           best_mode=o.best_mode,
                                           keep_without_metrics=o.keep_checkpoints_without_metrics,
                                           times=times, keep_time_interval=self._interval)

    def _step_times(self, steps: List[int]) -> Dict[int, float]:
        """{step: when it was committed, in seconds}, read from the markers
        once; now for the save just started (its commit comes a little later:
        as the newest step the policy keeps it anyway, unless best_fn drops
        it, and then the core may keep it by time where this does not)."""
        out: Dict[int, float] = {}
        for s in steps:
            if s not in self._times:
                try:
                    self._times[s] = self._mgr.describe(s)["created_unix_ms"] / 1000.0
                except NotFoundError:  # not committed yet: the save just started
                    out[s] = time.time()
                    continue
            out[s] = self._times[s]
        return out

    def _set_mode(self, single: bool) -> None:
        if self._single is None:
            self._single = single
        elif self._single != single:
            raise ValueError(
                "this manager saves " + ("one item (no args.Composite)" if self._single else "named items "
                                         "(args.Composite)") + "; a step of the other form cannot be mixed in"
            )

    def _save_request(self, items: Any, save_kwargs: Any, a: Any):
        if a is not None:
            if items is not None or save_kwargs is not None:
                raise ValueError("give either args or items/save_kwargs, not both")
            if isinstance(a, Mapping) and type(a).__name__ in ("Composite", "CompositeArgs"):
                self._set_mode(False)
                parts = dict(a.items())
            else:
                self._set_mode(True)
                parts = {DEFAULT_ITEM_NAME: a}
            if self._item_names is not None and not set(parts) <= set(self._item_names):
                raise ValueError(f"items {sorted(set(parts) - set(self._item_names))} are not in item_names")
            request = {n: (kind_of(x), x.item, getattr(x, "save_args", None)) for n, x in parts.items()}
            return request, self._single
        if items is None:
            raise ValueError("save needs args= (or the older items=)")
        if self._legacy is None:
            raise unsupported(
                "save(step, items) without checkpointers",
                "pass args=ocp.args.StandardSave(items), or CheckpointManager(dir, checkpointer)")
        if self._single:
            items, save_kwargs = {DEFAULT_ITEM_NAME: items}, {DEFAULT_ITEM_NAME: save_kwargs or {}}
        save_kwargs = save_kwargs or {}
        out = {}
        for name, item in items.items():
            if name not in self._legacy:
                raise ValueError(f"item {name!r} has no checkpointer (checkpointers: {sorted(self._legacy)})")
            kw = dict(save_kwargs.get(name) or {})
            sa = kw.pop("save_args", None)
            if kw:
                raise unsupported(f"save_kwargs {sorted(kw)} (item '{name}')")
            out[name] = (kind_of(self._legacy[name]), item, sa)
        return out, self._single

    def wait_until_finished(self) -> None:
        """Waits for the background save; raises its failure (mhckpt.Error)."""
        try:
            self._mgr.wait_until_finished()
        finally:
            self._pending.clear()

    def check_for_errors(self) -> None:
        """As :meth:`wait_until_finished` (mhckpt reports a save's outcome once it is committed)."""
        self.wait_until_finished()

    # --------------------------------------------------------------- restoring

    def restore(self, step: Optional[int], items: Any = None, restore_kwargs: Any = None,
                directory: Any = None, args: Any = None) -> Any:
        """Restores step ``step`` (None: the latest) into ``args`` (or the
        older ``items`` with ``restore_kwargs``). Returns the item, or a
        :class:`Composite` of the items."""
        if directory is not None:
            raise unsupported("restore(directory=...)", "open a CheckpointManager on that directory")
        if step is None:
            step = self._mgr.latest_step()
            if step is None:
                raise NotFoundError(f"no committed step in {self._directory}{_orbax_hint(self._directory)}")
        step = int(step)
        if step in self._pending:
            self.wait_until_finished()
        if step not in self._mgr.all_steps() and (self._directory / str(step)).is_dir():
            raise NotFoundError(
                f"step {step} is not committed in {self._directory}{_orbax_hint(self._directory)}")
        _, saved, single = self._store.layout(step)
        requests, single_out = self._restore_request(saved, single, items, restore_kwargs, args)
        got = self._store.restore(step, requests)
        if single_out:
            return got[next(iter(requests))]
        return Composite(**got)

    def _restore_request(self, saved: Dict[str, str], single: bool, items: Any, restore_kwargs: Any, a: Any):
        whole = "" in saved  # a plain mhckpt step
        default = "" if whole else DEFAULT_ITEM_NAME
        if a is not None:
            if items is not None or restore_kwargs is not None:
                raise ValueError("give either args or items/restore_kwargs, not both")
            if isinstance(a, Mapping) and type(a).__name__ in ("Composite", "CompositeArgs"):
                if single and not whole:
                    raise ValueError("the step holds one item, saved without args.Composite; restore it "
                                     "with StandardRestore")
                parts, single_out = dict(a.items()), False
            else:
                if not single:
                    raise ValueError(f"the step holds the items {sorted(saved)}: restore with args.Composite")
                parts, single_out = {default: a}, True
            return {n: _restore_item(saved, n, x) for n, x in parts.items()}, single_out
        if items is None and restore_kwargs is None:
            if single:
                return {default: (None, None, False)}, True
            return {n: (None, None, False) for n in saved}, False
        if single:
            items = {default: items}
            restore_kwargs = {default: restore_kwargs or {}}
        items = dict(items or {})
        restore_kwargs = dict(restore_kwargs or {})
        for n in restore_kwargs:
            items.setdefault(n, None)
        out = {}
        for n, item in items.items():
            kw = dict(restore_kwargs.get(n) or {})
            ra = kw.pop("restore_args", None)
            if kw:
                raise unsupported(f"restore_kwargs {sorted(kw)} (item '{n}')")
            out[n] = (item, ra, False)
        return out, single

    # ----------------------------------------------------------------- details

    def metrics(self, step: int) -> Any:
        """The metrics saved with step ``step``, or None."""
        return self._mgr.describe(int(step))["metadata"].get(METRICS_KEY)

    def metadata(self, step: Optional[int] = None) -> Any:
        """Orbax's: ``RootMetadata`` (step None; mhckpt keeps no root
        metadata, so both of its dicts are empty), or the ``StepMetadata`` of
        committed step ``step`` (its items' handlers and metadata, and its
        metrics), read from the step's commit marker. Local (no collective)."""
        if step is None:
            return RootMetadata()
        step = int(step)
        if step in self._pending:
            self.wait_until_finished()
        return step_metadata(self._mgr.describe(step), Composite)

    def item_metadata(self, step: int) -> Any:
        """``metadata(step).item_metadata``: for each tree item a tree of
        ``ArrayMetadata`` (shape, dtype) / ``ScalarMetadata`` /
        ``StringMetadata`` leaves, for a JSON item its content; the item's
        own, or a Composite of several items as the step was saved."""
        if step is None:
            raise ValueError("`step` must be provided: item_metadata exists only for a step")
        return self.metadata(step).item_metadata

    def close(self) -> None:
        """Waits for a pending save, raising its failure as Orbax does, and
        releases the manager (collective)."""
        try:
            if not self._mgr._impl.closed():
                self.wait_until_finished()
        finally:
            self._mgr.close()
            self._pending.clear()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the block's exception, not a save's, goes on
            self._mgr.close()
            self._pending.clear()

    def __repr__(self) -> str:
        return f"mhckpt.orbax.CheckpointManager({str(self._directory)!r})"


def _orbax_hint(directory: pathlib.Path) -> str:
    """A hint naming Orbax's own steps in ``directory``, which mhckpt.orbax does not read."""
    try:
        steps = sorted(int(d.name) for d in directory.iterdir()
                       if d.name.isdigit() and (d / "_CHECKPOINT_METADATA").is_file())
    except OSError:
        return ""
    if not steps:
        return ""
    return (f"; it holds Orbax's own checkpoints (steps {steps[:8]}), which mhckpt.orbax does not read: "
            f"convert them with `python -m mhckpt convert {directory} NEW_DIRECTORY`")


def _restore_item(saved: Dict[str, str], name: str, a: Any):
    kind = kind_of(a)
    if name in saved and saved[name] != kind:
        raise ValueError(f"item '{name}' was saved as a {saved[name]} item, restored as a {kind} item")
    partial = bool(getattr(a, "partial_restore", False))
    return getattr(a, "item", None), getattr(a, "restore_args", None), partial
