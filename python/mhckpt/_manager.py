"""``mhckpt.CheckpointManager``: save and restore pytrees of training state.

The class is put together from parts: the constructor, the catalogue and the
lifetime here; ``save`` and its policy in ``_saving.py``; ``restore`` in
``_restoring.py``; the map of keyword arguments onto the C++ ``Options`` in
``_options.py``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from . import _core, _preemption
from ._errors import Error, rank_error
from ._mpi import comm_handle, ensure_mpi, open_managers
from ._options import core_options
from ._plan import decode_description
from ._restoring import Restoring
from ._saving import Saving


class CheckpointManager(Saving, Restoring):
    """Saves and restores pytrees of training state as mhckpt checkpoints.

    Collective: every rank of ``comm`` creates the manager, and calls
    ``save``, ``wait_until_finished``, ``restore``, ``verify`` and ``close``
    in the same order. Errors are raised as :class:`mhckpt.Error` subclasses,
    the same on every rank.

    Args:
      root: the checkpoint directory, on a file system every rank sees.
      comm: an mpi4py communicator, or None for MPI's world (initialised here
        with ``MPI_THREAD_MULTIPLE`` unless someone has initialised MPI).
      max_to_keep: keep the newest N committed steps (0: all).
      keep_period: also keep steps that are multiples of this (0: none).
      keep_time_interval_seconds: also keep the oldest step and each one
        committed at least this long after the last one kept so (0: off).
      best_metric: keep the best ``max_to_keep`` steps by this key of their
        ``save(metadata=...)`` (a number) instead of the newest; steps
        without it are kept if ``keep_without_metric``; the newest may go.
      best_mode: ``"max"`` (higher is better) or ``"min"``.
      async_save: commit on a background thread (needs MPI_THREAD_MULTIPLE;
        otherwise ``save`` commits before returning).
      staging_budget_bytes: most host staging memory (0: one save's worth).
      verify_replicas: ranks holding the same box compare checksums before
        writing; a mismatch fails the save with DataLossError.
      replica_parallel_min_bytes: split replicated boxes of at least this
        many bytes among their holders for writing, in slices of about this
        size or more (0: off).
      collective_timeout_seconds: abort the job when a collective phase takes
        longer on any rank (0: never).
      snapshot_threads: threads copying into staging (0: up to 4).
      remove_uncommitted_on_open: delete steps that have no commit marker.
      collective_transfer: HDF5 collective instead of independent transfers.
      data_path: how a rank's bytes reach the data file with independent
        transfers: "direct" (pwrite at the datasets' offsets, O_DIRECT where
        the file system has it), "buffered" (the same through the page
        cache) or "hdf5" (H5Dwrite per box).
      writer_threads: writer threads per rank for "direct" and "buffered"
        (0: 2).
      checksum_chunk_bytes: bytes per checksummed chunk of a stored box, the
        unit a restore at another sharding reads and checks (0: 1 MiB).
      format_version: the checkpoint format written: 3 (checksums in an
        index file each rank reads only in part) or 2 (every checksum in
        the commit marker, for readers built before format 3). Every
        version restores.
      files: the data files of a step: ``"one"`` (the default: one
        ``data.h5``), ``"node"`` (one per node) or an int k (one per k
        ranks); with subfiles ``data.h5`` maps every array onto them as HDF5
        virtual datasets (h5py reads it as before). For parallel file
        systems; needs format 3 and the direct data path.
      own_root: take ownership of ``root`` (a lock and a lease) for the
        manager's lifetime; False opens it read-only: it removes nothing and
        ``save`` raises FailedPreconditionError.
      root_lease_seconds: a lease whose heartbeat is older is stale (matters
        only where file locks do not work, e.g. NFS without locking).
      root_wait_seconds: how long to keep trying while another job owns
        ``root`` (0: raise FailedPreconditionError at once).
      local_dir: a node-local directory (e.g. on /dev/shm) that turns on the
        local tier: every save commits there first, each node keeping its
        ranks' arrays and a copy of another node's, and ``root`` gets every
        ``persistent_every``-th save; a job that lost a node restores from
        the copies that survive (docs/TIERS.md). None:
        every save goes to ``root``.
      persistent_every: with ``local_dir``: saves 1, N+1, 2N+1, ... of this
        manager also go to ``root`` (1: every save).
      local_max_to_keep: steps the local tier keeps on each node (>= 1).
      local_copies: copies of each rank's arrays on other nodes.
      local_parity_group: XOR parity over groups of this many nodes instead
        of copies (0: copies): any one lost node of a group is rebuilt, for
        1/(g-1) of the memory of a copy.
      persistent_deadline_seconds: with ``local_dir``: > 0 writes ``root`` on
        a thread of its own; a write stuck past this many seconds is abandoned
        (an agreed IoError) and saves go on in the local tier (0: off).
      node_id: which node this rank is on, for tests that simulate nodes on
        one machine (None: the node MPI reports).
      reserve: what this process will save, known before the first save: a
        pytree like ``save``'s state (arrays, ``jax.eval_shape`` structs with
        their shardings) or a byte count. The staging memory is then mapped
        and touched on a background thread while training starts, so that
        the first ``save`` costs a memcpy (see :meth:`reserve`). None: the
        first save maps its own.
      carry_staging_over: on close, keep the staging memory mapped for the
        next manager of this process opened with this set (at most one
        buffer is kept): for code that opens a manager per save, such as
        ``mhckpt.torch`` (a directory per ``checkpoint_id``).
      preemption: install handlers for ``preemption_signals`` that record a
        preemption notice (as :func:`mhckpt.notify_preemption` does) instead
        of stopping the process; :meth:`reached_preemption` turns a notice on
        any rank into one step, the same on every rank. False (the default):
        no handler is installed, and notices come only from
        ``notify_preemption``. A signal that has a Python handler (set with
        ``signal.signal`` before the manager opens) keeps it: the notice is
        recorded, then that handler is called. Any other handler of these
        signals (the default action, or one installed outside Python, such as
        JAX's preemption service's SIGTERM handler) is replaced and not
        called until the manager closes, when it comes back. A handler set
        with ``signal.signal`` while the manager is open replaces mhckpt's
        (call :func:`mhckpt.notify_preemption` from it) and stays after
        close.
      preemption_signals: the signals of ``preemption`` (default SIGTERM and
        SIGUSR1: Slurm's ``--signal=USR1@60`` and ``scancel --signal=USR1``,
        a cloud VM's SIGTERM).
      preemption_grace_seconds: the scheduler's grace period (notice to
        kill), recorded with the preemption step (0: unknown).
      save_interval_steps: :meth:`should_save` is True at multiples of this
        (0: never by interval).
      save_continuously: :meth:`should_save` is also True whenever the
        previous save has finished on every rank and at least
        ``min_save_interval_seconds`` have passed since the last ``save``
        (Orbax's continuous checkpointing).
      min_save_interval_seconds: with ``save_continuously``.

    Use it as a context manager: leaving the block waits for pending saves
    and closes the manager (collective).
    """

    def __init__(
        self,
        root: str,
        comm: Any = None,
        *,
        max_to_keep: int = 0,
        keep_period: int = 0,
        keep_time_interval_seconds: float = 0.0,
        best_metric: Optional[str] = None,
        best_mode: str = "max",
        keep_without_metric: bool = True,
        async_save: bool = True,
        staging_budget_bytes: int = 0,
        verify_replicas: bool = False,
        replica_parallel_min_bytes: int = 0,
        collective_timeout_seconds: float = 3600.0,
        snapshot_threads: int = 0,
        remove_uncommitted_on_open: bool = True,
        collective_transfer: bool = False,
        data_path: str = "direct",
        writer_threads: int = 0,
        checksum_chunk_bytes: int = 0,
        format_version: int = 3,
        files: Any = "one",
        own_root: bool = True,
        root_lease_seconds: float = 60.0,
        root_wait_seconds: float = 0.0,
        local_dir: Optional[str] = None,
        persistent_every: int = 1,
        local_max_to_keep: int = 2,
        local_copies: int = 1,
        local_parity_group: int = 0,
        persistent_deadline_seconds: float = 0.0,
        node_id: Optional[int] = None,
        reserve: Any = None,
        carry_staging_over: bool = False,
        preemption: bool = False,
        preemption_signals: Sequence[int] = _preemption.DEFAULT_SIGNALS,
        preemption_grace_seconds: float = 0.0,
        save_interval_steps: int = 0,
        save_continuously: bool = False,
        min_save_interval_seconds: float = 0.0,
    ):
        settings = dict(locals())  # first: every keyword argument but these four is an option
        for k in ("self", "root", "comm", "reserve"):
            del settings[k]
        handle = comm_handle(comm)
        ensure_mpi()
        o, core_signals, chained = core_options(settings)
        self._rank, self._size = _core.rank_and_size(handle)
        self._root = str(root)
        self._signals = _preemption.PythonChain()
        self._impl = _core.Manager(handle, self._root, o)
        self._signals.install(chained)
        self._signals.note_core(core_signals)
        open_managers.add(self)
        if reserve is not None:
            self.reserve(reserve)

    # ------------------------------------------------------------ properties

    @property
    def root(self) -> str:
        """The checkpoint directory."""
        return self._root

    @property
    def rank(self) -> int:
        """This process's rank in the manager's communicator."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of ranks of the manager's communicator."""
        return self._size

    @property
    def async_save(self) -> bool:
        """True if saves commit on the background thread."""
        return self._impl.is_async()

    # -------------------------------------------------------------- catalogue

    def all_steps(self) -> List[int]:
        """The committed steps, ascending (local: reads the directory)."""
        return self._impl.steps()

    def step_tiers(self) -> Dict[int, Dict[str, bool]]:
        """The committed steps and where each is held (local): step ->
        ``{"persistent": in root, "local": in the local tier, restorable
        from the nodes of this job}``."""
        return {s: {"persistent": p, "local": loc} for s, p, loc in self._impl.tiers()}

    def latest_step(self) -> Optional[int]:
        """The newest committed step, or None (local)."""
        return self._impl.latest()

    def describe(self, step: int) -> Dict[str, Any]:
        """What committed step ``step`` holds (local, from its commit marker).

        Returns a dict with ``step``, ``format_version``, ``world_size`` (at save),
        ``total_bytes``, ``arrays`` (name -> dtype, shape, replicated,
        boxes), ``values`` (the non-array leaves), ``metadata`` (the
        ``metadata`` argument of ``save``) and ``preemption``: None, or for
        the step saved at the agreed preemption step (see
        :meth:`reached_preemption`) a dict of ``notice_unix_ms`` (when the
        earliest rank got the notice, Unix ms), ``grace_seconds``
        (``preemption_grace_seconds``, 0: unknown) and
        ``saved_after_seconds`` (from the notice to the commit). Raises NotFoundError if the step
        is not committed, DataLossError if its marker is damaged.
        """
        return decode_description(self._impl.describe(int(step)))

    # -------------------------------------------------------------- restoring

    def delete(self, step: int) -> None:
        """Deletes committed step ``step`` from every tier that holds it
        (collective), once the saves in flight have ended (their error is
        raised, and nothing deleted). Raises NotFoundError if no tier holds
        it, FailedPreconditionError (nothing deleted) if a reader still holds
        its local copy. The deletion is recorded in ``root``: a node outside
        this job that still holds a local copy of the step removes it when it
        rejoins (a later save of the same step number is kept)."""
        self._impl.delete(int(step))

    # ---------------------------------------------------------------- details

    def last_save_timings(self) -> Dict[str, Any]:
        """Phases of the last finished save on this rank, in seconds (local):
        budget_wait, snapshot (the stall of ``save``), plan, write, flush,
        commit, gc, and local_bytes / written_bytes."""
        return self._impl.timings()

    def staging_bytes(self) -> int:
        """Host staging memory held now, in bytes (local)."""
        return self._impl.staging_bytes()

    def close(self) -> None:
        """Waits for pending saves and releases the manager (collective).
        Errors of those saves are not raised here: call
        :meth:`wait_until_finished` first to see them."""
        if getattr(self, "_impl", None) is not None and not self._impl.closed():
            self._impl.close()
        if getattr(self, "_signals", None) is not None:
            self._signals.restore()
        open_managers.discard(self)

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.wait_until_finished()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"CheckpointManager(root={self._root!r}, rank={self._rank}, world_size={self._size})"

    def _agree(self, err: Optional[BaseException]) -> None:
        """Collective: returns on every rank if ``err`` is None on every
        rank, else raises the lowest failing rank's error (as an mhckpt
        Error naming that rank) on every rank. For code that finds errors of
        its own between collective calls (``python -m mhckpt convert``)."""
        self._call_agreed(err, self._impl.agree)

    def _call_agreed(self, err: Optional[BaseException], call, *args) -> Any:
        """Runs the collective ``call`` with this rank's error ``err`` (or
        None): the C++ side agrees on it first, so the lowest failing rank's
        error is raised on every rank and no rank enters the call alone."""
        local = rank_error(err, self._rank) if err is not None else None
        try:
            return call(*args, (local.code, local.message) if local else ("", ""))
        except Error as agreed:
            if err is not None:
                raise agreed from err  # keep this rank's own traceback as the cause
            raise
