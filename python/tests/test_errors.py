"""Every error: the right exception class, the same message on every rank,
naming what went wrong; never a hang."""
from __future__ import annotations

import numpy as np
import pytest

import mhckpt
from support import (
    all_equal_bytes,
    all_ok,
    block,
    flip_byte_of,
    pattern,
    raises_everywhere,
    step_data_file,
)


def save_one(mgr, step=1):
    state = {"layer": {"w": pattern("layer/w", (6, 4), "float32")}, "lr": 0.5}
    mgr.save(step, state)
    mgr.wait_until_finished()
    return state


def test_exception_classes():
    # Each class is an mhckpt.Error and the builtin a caller would catch.
    assert issubclass(mhckpt.InvalidArgumentError, (mhckpt.Error, ValueError))
    assert issubclass(mhckpt.NotFoundError, LookupError)
    assert issubclass(mhckpt.IoError, OSError)
    for cls in (mhckpt.AlreadyExistsError, mhckpt.DataLossError, mhckpt.FailedPreconditionError,
                mhckpt.InternalError):
        assert issubclass(cls, mhckpt.Error)
    e = mhckpt.DataLossError("array 'w' box [0:2]")
    assert e.code == "DATA_LOSS" and e.message == "array 'w' box [0:2]"
    assert str(e) == "DATA_LOSS: array 'w' box [0:2]"


def test_shape_and_dtype_mismatch_name_the_key(comm, mgr):
    save_one(mgr)
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(1, {"layer": {"w": np.zeros((6, 5), np.float32)}}),
                      contains=["'layer/w'", "(6, 5)", "(6, 4)"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(1, {"layer": {"w": np.zeros((6, 4), np.float64)}}),
                      contains=["'layer/w'", "float64", "float32"])

    # A Shard target whose global shape is not the stored one.
    def shard(rows, offset, global_shape):
        return {"layer": {"w": mhckpt.Shard(np.zeros((rows, 4), np.float32), offset, global_shape)}}

    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(1, shard(1, (0, 0), (7, 4))),
                      contains=["'layer/w'", "(7, 4)"])
    # A Shard target box outside the array (found by the C++ core).
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.restore(1, shard(2, (5, 0), (6, 4))),
                      contains=["'layer/w'", "box [5:7, 0:4]", "outside"])
    # Only one rank's target is wrong: every rank raises that rank's error.
    bad_rank = comm.size - 1

    def one_bad():
        shape = (6, 3) if comm.rank == bad_rank else (6, 4)
        mgr.restore(1, {"layer": {"w": np.zeros(shape, np.float32)}})

    msg = raises_everywhere(comm, mhckpt.InvalidArgumentError, one_bad,
                            contains=["'layer/w'", "(6, 3)"])
    assert f"rank {bad_rank}" in msg


def test_not_found(comm, mgr):
    save_one(mgr)
    for call in (lambda: mgr.restore(2), lambda: mgr.restore(2, {"layer": {"w": None}}),
                 lambda: mgr.verify(2)):
        raises_everywhere(comm, mhckpt.NotFoundError, call, contains=["step 2 is not committed"])
    with pytest.raises(mhckpt.NotFoundError):
        mgr.describe(2)  # local
    raises_everywhere(comm, mhckpt.NotFoundError,
                      lambda: mgr.restore(1, {"layer": {"w": None, "b": None}}),
                      contains=["'layer/b'", "step 1"])
    # A value leaf of the target that was never saved, too.
    raises_everywhere(comm, mhckpt.NotFoundError, lambda: mgr.restore(1, {"momentum": 0.9}),
                      contains=["'momentum'"])


def test_saving_a_committed_step_is_already_exists(comm, mgr):
    state = save_one(mgr, step=3)
    mgr.save(3, state)  # returns: the commit runs in the background
    raises_everywhere(comm, mhckpt.AlreadyExistsError, mgr.wait_until_finished,
                      contains=["step 3 is already committed"])
    # The committed step is untouched, and the manager still works.
    out = mgr.restore(3)
    all_equal_bytes(comm, out["layer"]["w"], state["layer"]["w"], "step 3 after the refused save")
    mgr.save(4, state)
    mgr.wait_until_finished()
    assert mgr.all_steps() == [3, 4]


def test_flipped_byte_is_data_loss(comm, mgr):
    n, rank = comm.size, comm.rank
    big = pattern("big", (64 * n, 1024), "float64")  # 512 KiB per rank, random bytes
    r0, rc = block(big.shape[0], rank, n)
    small = pattern("small", (5,), "int32")
    mgr.save(1, {"big": mhckpt.Shard(big[r0 : r0 + rc], (r0, 0), big.shape), "small": small})
    mgr.wait_until_finished()
    assert mgr.verify(1) == big.nbytes + small.nbytes

    comm.Barrier()
    if rank == 0:
        flip_byte_of(step_data_file(mgr.root, 1), big.tobytes())
    comm.Barrier()

    for call in (lambda: mgr.verify(1), lambda: mgr.restore(1)):
        raises_everywhere(comm, mhckpt.DataLossError, call, contains=["'big'", "checksum mismatch"])
    # The undamaged array still restores.
    out = mgr.restore(1, {"small": None})
    all_equal_bytes(comm, out["small"], small, "the undamaged array")
    # verify_checksums=False reads the damaged bytes as they are, unchecked.
    got = mgr.restore(1, {"big": None}, verify_checksums=False)["big"]
    all_ok(comm, got.tobytes() != big.tobytes(), "unchecked restore returns the damaged bytes")
    all_ok(comm, np.count_nonzero(got != big) == 1, "exactly one element differs")


def test_pytree_that_differs_across_ranks(comm, mgr):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    state = {"a": pattern("a", (4,), "float32")}
    if comm.rank == 1:
        state["extra"] = np.zeros(3, np.float32)

    def save():
        mgr.save(1, state)
        mgr.wait_until_finished()

    raises_everywhere(comm, mhckpt.InvalidArgumentError, save, contains=["'extra'", "rank 1"])
    # The same name with another shape on one rank.
    shape = (5,) if comm.rank == comm.size - 1 else (4,)

    def save_shape():
        mgr.save(2, {"a": np.zeros(shape, np.float32)})
        mgr.wait_until_finished()

    raises_everywhere(comm, mhckpt.InvalidArgumentError, save_shape,
                      contains=["'a'", f"rank {comm.size - 1} says float32 [5]"])
    # Nothing was committed, and a consistent save still works.
    assert mgr.all_steps() == []
    mgr.save(3, {"a": pattern("a", (4,), "float32")})
    mgr.wait_until_finished()
    assert mgr.all_steps() == [3]


def test_unsupported_leaves(comm, mgr):
    class Opaque:
        pass

    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, {"x": {"o": Opaque()}}), contains=["'x/o'", "Opaque"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, {"c": np.zeros(3, np.complex64)}),
                      contains=["'c'", "complex64"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, {"s": np.array(["a", "b"])}), contains=["'s'"])
    # Only the last rank has the bad leaf: the save fails on every rank, naming it.
    leaf = Opaque() if comm.rank == comm.size - 1 else np.zeros(2)
    msg = raises_everywhere(comm, mhckpt.InvalidArgumentError, lambda: mgr.save(1, {"x": leaf}),
                            contains=["'x'"])
    assert f"rank {comm.size - 1}" in msg
    # A Shard whose block, offset and global shape disagree in rank.
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, {"sh": mhckpt.Shard(np.zeros((2, 2)), (0,), (2, 2))}),
                      contains=["'sh'"])
    mgr.wait_until_finished()
    assert mgr.all_steps() == []


def test_two_leaves_with_one_name(comm, mgr):
    # A key holding '/' names the same leaf as nesting does: refused, not one
    # of the two silently lost.
    for state in ({"a/b": np.zeros(2), "a": {"b": np.ones(2)}},   # two arrays
                  {"x": {"a/b": 1, "a": {"b": 2}}},               # two values
                  {"a/b": np.zeros(2), "a": {"b": 5}}):           # an array and a value
        def save():
            mgr.save(1, state)
            mgr.wait_until_finished()

        raises_everywhere(comm, mhckpt.InvalidArgumentError, save, contains=["/b'"])
    assert mgr.all_steps() == []


def test_bad_metadata(comm, mgr):
    a = {"a": np.zeros(2)}
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, a, metadata={"mhckpt.python.values": 1}),
                      contains=["'mhckpt.python.values'", "mhckpt."])
    raises_everywhere(comm, mhckpt.InvalidArgumentError,
                      lambda: mgr.save(1, a, metadata={"when": object()}),
                      contains=["metadata 'when'", "JSON"])
    raises_everywhere(comm, mhckpt.InvalidArgumentError, lambda: mgr.save(1, a, metadata={3: "x"}),
                      contains=["3"])
    mgr.wait_until_finished()
    assert mgr.all_steps() == []


def test_use_after_close(comm, root):
    m = mhckpt.CheckpointManager(root)
    m.save(1, {"a": np.ones(2)})
    m.close()  # waits: step 1 is committed
    m.close()  # a second close does nothing
    calls = {
        "save": lambda: m.save(2, {"a": np.ones(2)}),
        "wait_until_finished": m.wait_until_finished,
        "restore": lambda: m.restore(1),
        "verify": lambda: m.verify(1),
        "describe": lambda: m.describe(1),
        "all_steps": m.all_steps,
        "latest_step": m.latest_step,
    }
    for name, call in calls.items():
        raises_everywhere(comm, mhckpt.FailedPreconditionError, call, contains=["closed"])
    with mhckpt.CheckpointManager(root) as again:
        assert again.all_steps() == [1]


def test_errors_the_core_finds_are_raised_by_wait(comm, mgr):
    # The core checks boxes and the step after the Python layer; its error on
    # one rank fails the save on every rank, raised by wait_until_finished.
    a = pattern("a", (4 * comm.size, 2), "float32")
    last = comm.size - 1
    offset = (4 * comm.size, 0) if comm.rank == last else (4 * comm.rank, 0)  # outside on one rank
    mgr.save(1, {"a": mhckpt.Shard(a[4 * comm.rank : 4 * comm.rank + 4], offset, a.shape)})
    msg = raises_everywhere(comm, mhckpt.InvalidArgumentError, mgr.wait_until_finished,
                            contains=["'a'", f"rank {last}"])
    mgr.save(-1, {"a": np.ones(1)})
    raises_everywhere(comm, mhckpt.InvalidArgumentError, mgr.wait_until_finished,
                      contains=["step -1 is negative"])
    assert mgr.all_steps() == [], msg
    mgr.save(2, {"a": np.ones(1)})  # the manager still works
    mgr.wait_until_finished()
    assert mgr.all_steps() == [2]


def test_bad_comm(mgr):
    with pytest.raises(TypeError, match="mpi4py communicator"):
        mhckpt.CheckpointManager(mgr.root, comm="world")


def test_bad_data_path(root):
    with pytest.raises(ValueError, match="data_path must be"):
        mhckpt.CheckpointManager(root, data_path="mmap")


def test_root_owned_by_another_manager(comm, root):
    with mhckpt.CheckpointManager(root) as owner:
        owner.save(1, {"x": np.arange(6, dtype=np.int64)})
        owner.wait_until_finished()
        # A second owner is refused on every rank, naming the lock.
        raises_everywhere(
            comm,
            mhckpt.FailedPreconditionError,
            lambda: mhckpt.CheckpointManager(root),
            contains=["in use"],
        )
        # A reader takes no ownership: it restores, and cannot save.
        with mhckpt.CheckpointManager(root, own_root=False) as reader:
            all_equal_bytes(comm, reader.restore(1)["x"], np.arange(6, dtype=np.int64), "reader")

            def save_and_wait():
                reader.save(2, {"x": np.arange(3)})
                reader.wait_until_finished()

            raises_everywhere(comm, mhckpt.FailedPreconditionError, save_and_wait)
