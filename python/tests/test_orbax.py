"""mhckpt.orbax: Orbax's CheckpointManager API on mhckpt, at every world size
(one CPU device per rank). The comparison with real Orbax, program against
program, is test_examples.py's."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok, pattern, raises_everywhere

ocp = pytest.importorskip("mhckpt.orbax")


def check_jax(comm, jd, out, want: np.ndarray, sharding, what: str) -> None:
    jax = jd.jax
    all_ok(comm, isinstance(out, jax.Array), f"{what}: a jax.Array, not {type(out)}")
    all_ok(comm, out.shape == want.shape and np.dtype(out.dtype) == want.dtype, f"{what}: shape/dtype")
    all_ok(comm, out.sharding.is_equivalent_to(sharding, want.ndim), f"{what}: sharding {out.sharding}")
    for s in out.addressable_shards:
        all_equal_bytes(comm, np.asarray(s.data), want[s.index], f"{what}: shard {s.index}")


def make_state(jd):
    n = jd.size
    data = {
        "w": pattern("orbax/w", (3 * n, 5), "float32"),
        "b": pattern("orbax/b", (7,), "bfloat16"),
        "count": pattern("orbax/count", (), "int32"),
    }
    shardings = {"w": jd.sharding(("x", None)), "b": jd.sharding(()), "count": jd.sharding(())}
    state = {"params": {k: jd.array(v, shardings[k]) for k, v in data.items()}, "epoch": 3}
    return data, shardings, state


def abstract_of(jd, shardings, data):
    return {"params": {k: jd.jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
                       for k, v in data.items()}, "epoch": 0}


@pytest.fixture
def jd(jax_dist):
    return jax_dist


def test_composite_save_restore(comm, jd, root):
    data, shardings, state = make_state(jd)
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(root, options=options) as mngr:
        assert mngr.save(0, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave({"lr": 0.5, "tags": ["a"]})))
        for x in jd.jax.tree.leaves(state):  # donated, deleted: the save holds copies
            if isinstance(x, jd.jax.Array):
                x.delete()
        mngr.wait_until_finished()
        assert mngr.all_steps() == [0] and mngr.latest_step() == 0

        got = mngr.restore(0, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_of(jd, shardings, data)), meta=ocp.args.JsonRestore()))
        assert isinstance(got, ocp.Composite) and sorted(got) == ["meta", "state"]
        assert got.meta == {"lr": 0.5, "tags": ["a"]}
        assert got.state["epoch"] == 3
        for k, v in data.items():
            check_jax(comm, jd, got.state["params"][k], v, shardings[k], f"state/params/{k}")

        # Without a target: every item, arrays as numpy.
        whole = mngr.restore(None)
        assert whole["meta"] == {"lr": 0.5, "tags": ["a"]}
        for k, v in data.items():
            all_equal_bytes(comm, whole["state"]["params"][k], v, f"no target: {k}")

        # One item of the two.
        only = mngr.restore(0, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        assert dict(only) == {"meta": {"lr": 0.5, "tags": ["a"]}}


def test_registered_pytree_state_restores_with_its_own_types(comm, jd, root):
    # A TrainState registered as flax.struct.dataclass registers one, holding
    # nodes with their own flatten (test_jax.py's classes).
    from test_jax import Moments, Pair, TrainState, _register

    jax = jd.jax
    _register(jax)
    n = comm.size
    rows = jd.sharding(("x", None))
    w, mu = pattern("orbax/reg/w", (2 * n, 3), "float32"), pattern("orbax/reg/mu", (2 * n, 3), "float32")
    state = TrainState(step=np.int64(3), params=Pair(jd.array(w, rows), np.arange(4.0)),
                       opt=Moments(jd.array(mu, rows), np.int32(9)), name="s")
    with ocp.CheckpointManager(root) as mngr:
        mngr.save(3, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows)
                              if isinstance(x, jax.Array) else x, state)
        got = mngr.restore(3, args=ocp.args.StandardRestore(target))
    all_ok(comm, type(got) is TrainState and type(got.params) is Pair and type(got.opt) is Moments
           and got.name == "s", f"types: {type(got)}")
    check_jax(comm, jd, got.params.a, w, rows, "params.a")
    check_jax(comm, jd, got.opt.mu, mu, rows, "opt.mu")
    all_equal_bytes(comm, np.asarray(got.params.b), np.arange(4.0), "params.b")
    all_ok(comm, int(got.step) == 3 and int(got.opt.nu) == 9, "scalars")


def test_keep_time_interval_keeps_what_orbax_keeps(comm, jd, root):
    # Real Orbax's policies (EveryNSeconds with LatestN), run save by save
    # over the commit times of the steps, keep the steps mhckpt keeps: in the
    # catalogue, and on disk (a manager opened afterwards lists them).
    import datetime
    import time

    pp = pytest.importorskip("orbax.checkpoint._src.checkpoint_managers.preservation_policy")
    interval = 2
    options = ocp.CheckpointManagerOptions(max_to_keep=1,
                                           keep_time_interval=datetime.timedelta(seconds=interval))
    policy = pp.AnyPreservationPolicy([pp.EveryNSeconds(interval_secs=interval), pp.LatestN(n=1)])

    @dataclasses.dataclass
    class Info:
        step: int
        time: datetime.datetime
        metrics: Any = None

    orbax_kept = []
    with ocp.CheckpointManager(root, options=options) as mngr:
        for step in range(6):
            if step == 3:
                comm.Barrier()
                time.sleep(interval + 0.2)
            mngr.save(step, args=ocp.args.StandardSave({"x": np.full(3, step, np.int32)}))
            mngr.wait_until_finished()
            ns = mngr.metadata(step).commit_timestamp_nsecs
            orbax_kept.append(Info(step, datetime.datetime.fromtimestamp(ns / 1e9)))
            keep = policy.should_preserve(orbax_kept, context=pp.PreservationContext())
            orbax_kept = [c for c, k in zip(orbax_kept, keep) if k]
        want = [c.step for c in orbax_kept]
        assert 0 in want and 5 in want, want
        assert mngr.all_steps() == want
        got = mngr.restore(want[0], args=ocp.args.StandardRestore({"x": np.zeros(3, np.int32)}))
        all_equal_bytes(comm, got["x"], np.full(3, want[0], np.int32), "the oldest step kept")
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True)) as ro:
        assert ro.all_steps() == want


def test_should_save_and_retention(comm, jd, root):
    """Orbax's rules: the first step, then every save_interval_steps-th
    step newer than the latest; keep the newest max_to_keep and every
    keep_period-th step."""
    options = ocp.CheckpointManagerOptions(save_interval_steps=3, max_to_keep=2, keep_period=6)
    x = np.arange(4, dtype=np.float32)
    with ocp.CheckpointManager(root, options=options) as mngr:
        saved = [s for s in range(1, 14) if mngr.save(s, args=ocp.args.StandardSave({"x": x + s}))]
        assert saved == [1, 3, 6, 9, 12]
        assert not mngr.should_save(12) and not mngr.should_save(11)
        mngr.wait_until_finished()
        assert mngr.all_steps() == [6, 9, 12]
        with pytest.raises(ocp.StepAlreadyExistsError):
            mngr.save(12, args=ocp.args.StandardSave({"x": x}), force=True)
        got = mngr.restore(9, args=ocp.args.StandardRestore({"x": x}))
        all_equal_bytes(comm, got["x"], x + 9, "step 9")
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True)) as ro:
        assert ro.latest_step() == 12 and not ro.save(13, args=ocp.args.StandardSave({"x": x}))


def test_seed_pattern_async_aggregate_and_donation(comm, jd, root):
    """Orbax 0.4's style: an AsyncCheckpointer, aggregate=True save args for
    every replicated array (flax's save_args_from_target), and a jitted
    update that donates the state right after each save."""
    jax = jd.jax
    from jax.experimental import multihost_utils

    data, shardings, state = make_state(jd)
    state = state["params"]

    @jax.jit
    def _step(s):
        return jax.tree.map(lambda a: a + a.dtype.type(1), s)

    update = jax.jit(_step, donate_argnums=0)
    mngr = ocp.CheckpointManager(root, ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler()),
                                 ocp.CheckpointManagerOptions(max_to_keep=3))
    want = {}
    for step in range(3):
        save_args = jax.tree.map(lambda a: ocp.SaveArgs(aggregate=a.is_fully_replicated), state)
        assert mngr.save(step, state, save_kwargs={"save_args": save_args})
        want[step] = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
                      for k, v in state.items()}
        state = update(state)  # donates what was just saved
        jax.block_until_ready(state)
    mngr.wait_until_finished()
    assert mngr.all_steps() == [0, 1, 2]
    target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in data.items()}
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    for step in range(3):
        got = mngr.restore(step, items=target, restore_kwargs={"restore_args": restore_args})
        for k, v in want[step].items():
            check_jax(comm, jd, got[k], v, shardings[k], f"step {step}: {k}")
    mngr.close()


def test_save_args_dtype_and_restore_args(comm, jd, root):
    jax = jd.jax
    data, shardings, state = make_state(jd)
    # bfloat16 -> float32: exact, so the cast back at restore gives the saved bytes.
    save_args = {"params": {"w": None, "b": ocp.SaveArgs(dtype=np.float32), "count": None}, "epoch": None}
    with ocp.CheckpointManager(root) as mngr:
        mngr.save(1, args=ocp.args.PyTreeSave(state, save_args=save_args))
        mngr.wait_until_finished()
        assert mngr._mgr.describe(1)["arrays"]["default/params/b"]["dtype"] == "float32"
        # A bfloat16 target casts the stored float32 back; a RestoreArgs asks for numpy.
        abstract = abstract_of(jd, shardings, data)
        got = mngr.restore(1, args=ocp.args.StandardRestore(abstract))
        check_jax(comm, jd, got["params"]["b"], data["b"], shardings["b"], "b, float32 -> bfloat16")
        restore_args = {"params": {"w": ocp.RestoreArgs(restore_type=np.ndarray), "b": None, "count": None},
                        "epoch": None}
        got = mngr.restore(1, args=ocp.args.PyTreeRestore(abstract, restore_args=restore_args))
        all_ok(comm, isinstance(got["params"]["w"], np.ndarray), "w restored as numpy")
        all_equal_bytes(comm, got["params"]["w"], data["w"], "w")
        # A subset only with partial_restore.
        part = {"params": {"w": abstract["params"]["w"]}}
        raises_everywhere(comm, mhckpt.InvalidArgumentError,
                          lambda: mngr.restore(1, args=ocp.args.StandardRestore(part)),
                          contains=["partial_restore", "params/b"])
        got = mngr.restore(1, args=ocp.args.PyTreeRestore(part, partial_restore=True))
        check_jax(comm, jd, got["params"]["w"], data["w"], shardings["w"], "partial w")
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(part)


def test_restores_a_plain_mhckpt_step(comm, jd, root):
    data, shardings, state = make_state(jd)
    with mhckpt.CheckpointManager(root) as mgr:
        mgr.save(5, state)
    with ocp.CheckpointManager(root) as mngr:
        assert mngr.latest_step() == 5
        got = mngr.restore(5, args=ocp.args.StandardRestore(abstract_of(jd, shardings, data)))
        for k, v in data.items():
            check_jax(comm, jd, got["params"][k], v, shardings[k], f"plain step: {k}")


def test_unsupported_features_raise(comm, jd, root):
    U = mhckpt.UnsupportedError
    for kw, name in [({"preservation_policy": object()}, "preservation_policy.*best_fn"),
                     ({"step_prefix": "ckpt"}, "step_prefix.*step_<step, 10 digits>"),
                     ({"step_format_fixed_length": 8}, "step_format_fixed_length.*step_<step"),
                     ({"todelete_subdir": "trash"}, "todelete_subdir")]:
        with pytest.raises(U, match=name):
            ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(**kw))
    with pytest.raises(TypeError, match="keep_time_interval must be a datetime.timedelta"):
        ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(keep_time_interval=3600))
    with pytest.raises(U, match="use_ocdbt"):
        ocp.PyTreeCheckpointHandler(use_ocdbt=False)
    with pytest.raises(U, match="transforms"):
        ocp.args.PyTreeRestore({}, transforms={})
    with pytest.raises(U, match="ArraySave"):
        ocp.args.ArraySave(np.zeros(2))
    x = {"x": np.zeros(3, np.float32)}
    with ocp.CheckpointManager(root) as mngr:
        with pytest.raises(U, match="chunk_byte_size"):
            save_args = {"x": ocp.SaveArgs(chunk_byte_size=1 << 20)}
            mngr.save(0, args=ocp.args.StandardSave(x, save_args=save_args))
        with pytest.raises(U, match="custom_metadata"):
            mngr.save(0, args=ocp.args.StandardSave(x), custom_metadata={"a": 1})
        assert mngr.all_steps() == []
        assert issubclass(U, NotImplementedError) and issubclass(U, mhckpt.InvalidArgumentError)


def test_best_fn_delete_and_best_step(comm, jd, root):
    """Orbax's BestN: the best max_to_keep steps by best_fn (between equal
    values the later step), steps without metrics kept as
    keep_checkpoints_without_metrics says, the newest step dropped when it
    is not among the best; best_step(); delete() (examples: test_examples.py
    compares all of it with real Orbax)."""
    x = np.arange(4, dtype=np.float32)
    accuracy = {1: 0.5, 2: 0.9, 3: 0.7, 4: None, 5: 0.9, 6: 0.1}
    options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["accuracy"])
    with ocp.CheckpointManager(root, options=options) as mngr:
        assert mngr.best_step() is None
        for s, a in accuracy.items():
            assert mngr.save(s, args=ocp.args.StandardSave({"x": x + s}),
                             metrics=None if a is None else {"accuracy": a})
        assert mngr.all_steps() == [2, 4, 5] and mngr.best_step() == 5  # 1, 3 and the newest, 6, dropped
        mngr.wait_until_finished()
        assert mngr.all_steps() == [2, 4, 5] and not mngr.is_saving_in_progress()
        assert mngr._mgr.describe(5)["metadata"]["orbax.best"] == 0.9
        mngr.delete(2)
        assert mngr.all_steps() == [4, 5]
        for gone in (2, 6, 7):
            raises_everywhere(comm, FileNotFoundError, lambda g=gone: mngr.delete(g),
                              contains=[f"non-existent step: {gone}"])
    options = ocp.CheckpointManagerOptions(max_to_keep=2, best_fn=lambda m: m["accuracy"], best_mode="min",
                                           keep_checkpoints_without_metrics=False)
    with ocp.CheckpointManager(root, options=options) as mngr:
        assert mngr.all_steps() == [4, 5] and mngr.best_step() == 5  # the one step with metrics
        assert mngr.save(7, args=ocp.args.StandardSave({"x": x + 7}), metrics={"accuracy": 0.3})
        assert mngr.all_steps() == [5, 7] and mngr.best_step() == 7  # 4, without metrics, dropped
        got = mngr.restore(mngr.best_step(), args=ocp.args.StandardRestore({"x": x}))
        all_equal_bytes(comm, got["x"], x + 7, "best step")
    with pytest.raises(ValueError, match="best_mode"):
        ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(best_fn=len, best_mode="top"))
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True)) as ro:
        ro.delete(7)  # read-only: a warning, nothing deleted (Orbax's)
        assert ro.all_steps() == [5, 7] and ro.best_step() == 7  # without best_fn: the latest


def test_metadata_and_item_metadata(comm, jd, root):
    """Orbax's metadata(): RootMetadata without a step, StepMetadata of a
    step (item handlers, a tree of ArrayMetadata/ScalarMetadata per tree
    item, JSON items' content, metrics); item_metadata(step) its items."""
    data, shardings, state = make_state(jd)
    state["name"] = "run1"
    with ocp.CheckpointManager(root) as mngr:
        root_md = mngr.metadata()
        assert root_md.custom_metadata == {} and root_md.internal_metadata == {}
        assert mngr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave({"lr": 0.5})),
                         metrics={"loss": 0.25})
        md = mngr.metadata(1)  # waits for a pending save of that step
        assert sorted(md.item_handlers) == ["meta", "state"]
        assert md.item_handlers["state"].endswith("StandardCheckpointHandler")
        assert md.item_handlers["meta"].endswith("JsonCheckpointHandler")
        assert md.metrics == {"loss": 0.25}
        items = md.item_metadata
        assert isinstance(items, ocp.Composite) and sorted(items) == ["meta", "state"]
        assert items["meta"] == {"lr": 0.5}
        tree = items["state"]
        assert sorted(tree) == ["epoch", "name", "params"] and sorted(tree["params"]) == ["b", "count", "w"]
        for k, v in data.items():
            a = tree["params"][k]
            assert type(a).__name__ == "ArrayMetadata", a
            assert a.shape == v.shape and np.dtype(a.dtype) == v.dtype, (k, a)
            assert a.name == f"state/params/{k}"
        assert type(tree["epoch"]).__name__ == "ScalarMetadata" and np.dtype(tree["epoch"].dtype).kind == "i"
        assert type(tree["name"]).__name__ == "StringMetadata"
        assert dict(mngr.item_metadata(1)) == dict(items)
        raises_everywhere(comm, mhckpt.NotFoundError, lambda: mngr.metadata(7))
    with ocp.CheckpointManager(f"{root}/single") as mngr:
        assert mngr.save(2, args=ocp.args.StandardSave({"x": np.zeros((2, 3), np.int16)}))
        single = mngr.metadata(2)  # saved without item names: the item itself
        assert single.item_handlers.endswith("StandardCheckpointHandler") and single.metrics == {}
        x = mngr.item_metadata(2)["x"]
        assert x.shape == (2, 3) and np.dtype(x.dtype) == np.int16
        with pytest.raises(ValueError, match="step"):
            mngr.item_metadata(None)
    with mhckpt.CheckpointManager(f"{root}/plain") as mgr:  # a plain mhckpt step: one tree item
        mgr.save(5, {"w": np.ones(4, np.float64)})
    with ocp.CheckpointManager(f"{root}/plain") as mngr:
        plain = mngr.item_metadata(5)
        assert plain["w"].shape == (4,) and np.dtype(plain["w"].dtype) == np.float64


@pytest.mark.skipif(int(__import__("os").environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1,
                    reason="imports real Orbax in a child process: world size 1 only")
def test_metadata_fields_are_orbaxs():
    """The metadata classes have Orbax's fields, in Orbax's order (real
    Orbax, imported in a child process so that it stays out of the suite's)."""
    pytest.importorskip("orbax.checkpoint")
    import dataclasses
    import json
    import subprocess
    import sys

    from mhckpt.orbax import _metadata

    names = ["StepMetadata", "RootMetadata", "ArrayMetadata", "ScalarMetadata", "StringMetadata"]
    code = ("import dataclasses, json\n"
            "from orbax.checkpoint import metadata as m\n"
            "from orbax.checkpoint._src.metadata import checkpoint as c\n"
            "cls = {'StepMetadata': c.StepMetadata, 'RootMetadata': c.RootMetadata, "
            "'ArrayMetadata': m.ArrayMetadata, 'ScalarMetadata': m.ScalarMetadata, "
            "'StringMetadata': m.StringMetadata}\n"
            "print(json.dumps({k: [f.name for f in dataclasses.fields(v)] for k, v in cls.items()}))\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr[-4000:]
    theirs = json.loads(p.stdout.strip().splitlines()[-1])
    ours = {n: [f.name for f in dataclasses.fields(getattr(_metadata, n))] for n in names}
    assert ours == theirs


def test_standalone_checkpointers(comm, jd, root):
    """``StandardCheckpointer().save(path, state)`` / ``.restore(path, abstract)``,
    as Flax's guides use it; a second save needs force=True."""
    import os

    data, shardings, state = make_state(jd)
    path = os.path.join(root, "state")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, state)
        ckptr.wait_until_finished()
        got = ckptr.restore(path, abstract_of(jd, shardings, data))
        for k, v in data.items():
            check_jax(comm, jd, got["params"][k], v, shardings[k], f"restore: {k}")
        raises_everywhere(comm, ValueError, lambda: ckptr.save(path, state), contains=["already exists"])
        doubled = jd.jax.tree.map(lambda x: x + x, state)
        ckptr.save(path, doubled, force=True)
        got = ckptr.restore(path, args=ocp.args.StandardRestore(abstract_of(jd, shardings, data)))
        check_jax(comm, jd, got["params"]["w"], data["w"] + data["w"], shardings["w"], "after force=True")
        assert got["epoch"] == 6
    meta = os.path.join(root, "meta")
    ocp.Checkpointer(ocp.JsonCheckpointHandler()).save(meta, args=ocp.args.JsonSave({"a": [1, 2]}))
    assert ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(meta) == {"a": [1, 2]}


def test_restore_without_target_keeps_lists(comm, jd, root):
    layers = [{"w": np.full((2, 2), i, np.float32)} for i in range(3)]
    state = {"layers": layers, "pair": (np.arange(3, dtype=np.int16), 5), "top": np.ones(1, np.uint8)}
    with ocp.CheckpointManager(root) as mngr:
        mngr.save(0, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
        got = mngr.restore(0)
    assert isinstance(got["layers"], list) and len(got["layers"]) == 3
    assert isinstance(got["pair"], list) and got["pair"][1] == 5
    for i in range(3):
        all_equal_bytes(comm, got["layers"][i]["w"], layers[i]["w"], f"layers/{i}/w")
    all_equal_bytes(comm, got["pair"][0], state["pair"][0], "pair/0")
