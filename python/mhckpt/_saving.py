"""The saving half of ``mhckpt.CheckpointManager`` (``save``, ``reserve``,
``wait_until_finished``, the save policy and preemption) and ``SaveFence``.

``Saving`` is a mixin of :class:`mhckpt.CheckpointManager`, which supplies
``_impl`` (the C++ manager), ``_rank`` and ``_call_agreed``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from . import _leaves, _pytree
from ._errors import InvalidArgumentError
from ._plan import check_no_array_is_a_group, donation_check, encode_metadata


class Saving:
    """Saving methods of :class:`mhckpt.CheckpointManager`."""

    _impl: Any

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
