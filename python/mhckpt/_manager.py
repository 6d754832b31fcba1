"""``mhckpt.CheckpointManager``: save and restore pytrees of training state."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _core, _leaves, _preemption, _pytree
from ._errors import DataLossError, Error, InvalidArgumentError, NotFoundError, rank_error
from ._mpi import comm_handle, ensure_mpi, open_managers
from ._plan import (
    check_no_array_is_a_group,
    decode_description,
    donation_check,
    encode_metadata,
    plan_restore,
)


class CheckpointManager:
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
        handle = comm_handle(comm)
        ensure_mpi()
        o = _core.Options()
        o.max_to_keep = max_to_keep
        o.keep_period = keep_period
        o.keep_time_interval_seconds = keep_time_interval_seconds
        if best_mode not in ("max", "min"):
            raise ValueError("best_mode=%r: want 'max' or 'min'" % (best_mode,))
        o.best_metric = "" if best_metric is None else str(best_metric)
        o.best_maximize = best_mode == "max"
        o.keep_without_metric = bool(keep_without_metric)
        o.async_save = async_save
        o.staging_budget_bytes = staging_budget_bytes
        o.verify_replicas = verify_replicas
        o.replica_parallel_min_bytes = replica_parallel_min_bytes
        o.collective_timeout_seconds = collective_timeout_seconds
        o.snapshot_threads = snapshot_threads
        o.remove_uncommitted_on_open = remove_uncommitted_on_open
        o.collective_transfer = collective_transfer
        o.data_path = data_path
        o.writer_threads = writer_threads
        o.checksum_chunk_bytes = checksum_chunk_bytes
        o.format_version = format_version
        if files == "one":
            o.ranks_per_file = 0
        elif files == "node":
            o.ranks_per_file = -1
        elif isinstance(files, int) and not isinstance(files, bool) and files > 0:
            o.ranks_per_file = files
        else:
            raise ValueError("files=%r: want 'one', 'node' or a positive int" % (files,))
        o.own_root = own_root
        o.root_lease_seconds = root_lease_seconds
        o.root_wait_seconds = root_wait_seconds
        o.local_dir = "" if local_dir is None else str(local_dir)
        o.persistent_every = persistent_every
        o.local_max_to_keep = local_max_to_keep
        o.local_copies = local_copies
        o.local_parity_group = local_parity_group
        o.persistent_deadline_seconds = persistent_deadline_seconds
        o.node_id = -1 if node_id is None else node_id
        o.carry_staging_over = carry_staging_over
        core_signals: List[int] = []
        chained: Dict[int, Any] = {}
        if preemption:
            core_signals, chained = _preemption.split_signals(preemption_signals)
        o.preemption_enabled = bool(core_signals)
        o.preemption_signals = core_signals
        o.preemption_grace_seconds = preemption_grace_seconds
        o.save_interval_steps = save_interval_steps
        o.save_continuously = save_continuously
        o.min_save_interval_seconds = min_save_interval_seconds
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

    # ----------------------------------------------------------------- saving

    def reserve(self, state: Any) -> None:
        """Maps and touches, on a background thread, the staging memory that
        saving ``state`` will take on this process (local; ``state`` as for
        ``save``, or ``jax.eval_shape`` of it, or a byte count), so that the
        first ``save`` finds it ready instead of paying for page faults on
        fresh memory, many times slower than the copy itself. A save that
        starts before the touching ends waits only for the rest."""
        if isinstance(state, int):
            total = state
        else:
            leaves, _ = _pytree.flatten(state, _leaves.is_leaf)
            total = sum(_leaves.local_bytes(leaf) for _, leaf in leaves)
        self._impl.reserve(int(total))

    def save(
        self,
        step: int,
        state: Any,
        metadata: Optional[Mapping[str, Any]] = None,
        *,
        tier: Optional[str] = None,
        lazy: bool = False,
        protect_host: bool = False,
    ) -> "SaveFence":
        """Starts saving ``state`` as step ``step``.

        Returns once every local buffer of ``state`` (shards and replicas, host
        or device) is copied into mhckpt's memory: the caller may then
        overwrite, donate, delete or free every array. Planning, writing,
        fsync and the commit run in the background; their outcome is raised
        by :meth:`wait_until_finished` (or the next collective call).

        With ``lazy=True`` it returns before copying, and the copy runs on
        mhckpt's threads while training computes. Call ``.wait()`` on the
        returned :class:`SaveFence` before any saved array is overwritten,
        donated or deleted -- in a training loop, just before the step that
        donates the state::

            fence = mgr.save(step, state, lazy=True)
            batch = next(data)                 # work that reads, not writes, the state
            fence.wait()
            state = train_step(state, batch)   # donates state

        Until the copy ends mhckpt holds a reference to every saved object
        and to every temporary it made from one (the contiguous copy of a
        strided or transposed numpy array or tensor, the array of a numpy
        scalar), and drops them when it ends: deleting the caller's last
        reference before then frees nothing. What the caller owns is the
        bytes: they must stay unchanged until the fence. A ``jax.Array``
        donated or deleted before then fails the save on every rank
        (InvalidArgumentError naming the array, from
        :meth:`wait_until_finished`); its bytes are never committed. numpy
        and torch buffers cannot tell mhckpt they were written:
        ``protect_host=True`` write-protects their pages until copied, so
        that such a write kills the process with a message naming the array
        (for debugging: two mprotect calls per buffer). Device buffers are
        copied on mhckpt's CUDA streams after the work queued on their stream
        before ``save`` (not after later work), and the fence completes once
        those copies have; this device path has not yet run on a GPU (it is
        compiled, and its tests skip without a device).

        Args:
          step: a non-negative step number, the same on every rank.
          state: a pytree (nested dicts, lists, tuples, namedtuples, and with
            jax imported any registered pytree node) whose leaves are arrays
            (numpy, :class:`mhckpt.Shard`, ``jax.Array``, ``torch.Tensor`` or
            ``DTensor``) or values (None, bool, int, float, str). A leaf's
            name is its key path joined with '/'. Values are rank 0's.
          metadata: JSON-serializable values by string key, stored in the
            commit marker (rank 0's); read back with :meth:`describe`.
          tier: with ``local_dir``: "local" (this save stays in the local
            tier), "persistent" (it goes to ``root`` too) or None (as
            ``persistent_every`` says). The same on every rank.

          lazy: return before copying (above).
          protect_host: with ``lazy``, write-protect host buffers until copied.

        Returns a :class:`SaveFence`, complete at once unless ``lazy``.

        Raises (the same on every rank): InvalidArgumentError for a leaf,
        dtype, buffer or metadata that cannot be saved on any rank. What the
        core checks next (boxes inside the array, a non-negative step, the
        same arrays on every rank) fails the save on every rank, raised by
        :meth:`wait_until_finished`.
        """
        err: Optional[BaseException] = None
        specs: List[Any] = []
        meta: Dict[str, str] = {}
        keep: List[Any] = []
        jax_arrays: List[Any] = []
        step_i = 0
        try:
            step_i = int(step)  # here: a bad one is this rank's error, agreed
            if tier is not None and not isinstance(tier, str):
                raise InvalidArgumentError(f"tier={tier!r}: want None, 'local' or 'persistent'")
            leaves, _ = _pytree.flatten(state, _leaves.is_leaf)
            values: Dict[str, Any] = {}
            names = set()
            for path, leaf in leaves:
                name = _pytree.path_name(path)
                if name in names:  # e.g. keys "a/b" and "a" -> "b"
                    raise InvalidArgumentError(
                        f"leaf '{name}': two leaves of the state have this name"
                    )
                names.add(name)
                if _leaves.is_value(leaf):
                    values[name] = leaf
                    continue
                _leaves.check_array_name(name)
                a = _leaves.save_array(name, leaf)
                # The leaf and every buffer object handed to C++ (a copy made
                # of a strided array, a numpy scalar's array, a contiguous
                # copy of a transposed tensor): a lazy copy reads them after
                # save returns, so they live until it ends.
                keep.append(leaf)
                keep.extend(shard[2] for shard in a.shards)
                if lazy and _leaves.is_jax_array(leaf):
                    jax_arrays.append((name, leaf))
                specs.append(a.spec())
            check_no_array_is_a_group([spec[0] for spec in specs])
            meta = encode_metadata(metadata, values)
        except Exception as e:  # agreed by the C++ core, raised on every rank
            err, specs = e, []
        check = donation_check(keep, jax_arrays) if lazy else None
        core = self._call_agreed(err, self._impl.save, step_i, specs, meta, tier or "",
                                 bool(lazy), bool(protect_host), check)
        return SaveFence(core)

    def wait_until_finished(self) -> None:
        """Waits for every save started so far to commit or fail.

        Raises the first failure since the last call, the same on every rank:
        InvalidArgumentError (inconsistent input across ranks, naming array,
        rank and box), AlreadyExistsError (the step was committed before),
        IoError (naming the rank), DataLossError (replicas that differ, with
        ``verify_replicas``), InternalError.
        """
        self._impl.wait()

    # ------------------------------------------------------------- preemption

    def reached_preemption(self, step: int) -> bool:
        """True on every rank, at the same step, once any rank has had a
        preemption notice (a signal of ``preemption_signals`` with
        ``preemption=True``, or :func:`mhckpt.notify_preemption`), and at
        every later step. The loop then saves this step, waits for it
        (:meth:`wait_until_finished`) and exits::

            for step in range(start, steps):
                state = train_step(state, next(data))
                if mgr.should_save(step):           # True at the preemption step too
                    mgr.save(step, state)
                if mgr.reached_preemption(step):
                    mgr.wait_until_finished()
                    break

        Collective: called once per training step by every rank with the same
        step, in the same order as the other collective calls. It does not
        block: each new step starts a small non-blocking allreduce and
        decides from the one started at the previous step, so a notice that
        arrives during step s is acted on at step s+1 or s+2 (the first step
        after the manager opens never reports one). A second call for the
        same step (``should_save`` and then this) returns the first's
        answer. The GIL is released while it waits for the previous round.

        Raises InvalidArgumentError on every rank, one step late, if the
        ranks called with different steps.
        """
        return self._impl.reached_preemption(int(step))

    def should_save(self, step: int) -> bool:
        """Whether to save ``step`` under the manager's save policy: a
        multiple of ``save_interval_steps``, or, with ``save_continuously``,
        when the previous save had finished on every rank and
        ``min_save_interval_seconds`` had passed (as of the previous step's
        round, with no ``save`` since), and always at the first step
        :meth:`reached_preemption` is True at. The same answer on every rank.
        Collective, as :meth:`reached_preemption` (with which it shares the
        step's round)."""
        return self._impl.should_save(int(step))

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


class SaveFence:
    """Completes when a save has copied every local buffer into mhckpt's
    memory (at once for a save without ``lazy``). Until then no saved array
    may be overwritten, donated or deleted."""

    def __init__(self, core: Any):
        self._core = core

    def wait(self) -> None:
        """Blocks (without the GIL) until the copy has ended. A copy that
        failed (an array donated during it) does not raise here: the save
        fails on every rank, raised by ``wait_until_finished``."""
        self._core.wait()

    def done(self) -> bool:
        """Whether the copy has ended (does not block)."""
        return self._core.done()
