"""The pytrees of the model libraries, by name: flax's ``TrainState`` (a
``flax.struct.dataclass`` holding an optax ``adamw`` state), a flax NNX model's
``nnx.State`` in the save/``eval_shape``/``split``/``merge`` flow of Orbax's
NNX guide, and an equinox module split with ``eqx.partition``. Each is saved
with sharded ``jax.Array`` leaves through mhckpt and mhckpt.orbax, restored
into a target built the way each library's docs build it, and must come back
as its own types with every leaf's bytes; the NNX state is also saved and
restored with real Orbax, and both trees must be the same."""
from __future__ import annotations

import numpy as np
import pytest

import mhckpt
from support import all_equal_bytes, all_ok

flax = pytest.importorskip("flax")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")
ocp = pytest.importorskip("mhckpt.orbax")


@pytest.fixture
def jd(jax_dist):
    return jax_dist


def global_tree(jd, tree):
    """Each leaf as a global jax.Array: split by rows over the ranks where
    they divide evenly, else replicated (every rank built the same values)."""
    jax = jd.jax

    def one(x):
        x = np.asarray(x)
        rows = x.ndim > 0 and x.shape[0] % jd.size == 0
        return jd.array(x, jd.sharding(("x",) + (None,) * (x.ndim - 1) if rows else ()))

    return jax.tree.map(one, tree)


def abstract_of(jd, tree):
    """A restore target: ShapeDtypeStructs with each array's sharding; other
    leaves (TrainState's step, a Python int) as they are."""
    jax = jd.jax
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
                        if isinstance(x, jax.Array) else x, tree)


def same_tree(comm, jd, got, want, what: str) -> None:
    """The same tree structure (types and static fields included) and every
    leaf's bytes, shard by shard."""
    jax = jd.jax
    all_ok(comm, jax.tree.structure(got) == jax.tree.structure(want),
           f"{what}: structure {jax.tree.structure(got)} != {jax.tree.structure(want)}")
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        name = f"{what}{jax.tree_util.keystr(path)}"
        if isinstance(w, jax.Array):
            all_ok(comm, isinstance(g, jax.Array) and g.sharding.is_equivalent_to(w.sharding, w.ndim),
                   f"{name}: {type(g)} {getattr(g, 'sharding', None)}")
            for gs, ws in zip(g.addressable_shards, w.addressable_shards):
                all_equal_bytes(comm, np.asarray(gs.data), np.asarray(ws.data), name)
        else:
            all_equal_bytes(comm, np.asarray(g), np.asarray(w), name)


def adamw(jd):
    """optax's adamw with weight decay masked to the matrices."""
    jax = jd.jax
    return optax.adamw(1e-2, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))


def trained_flax_state(jd, tx, scale: float):
    """A flax TrainState after one step of ``tx`` (mu, nu and count non-zero)."""
    from flax.training import train_state

    jax = jd.jax
    n = jd.size
    rng = np.random.default_rng(7)
    params = {"dense": {"kernel": rng.standard_normal((4 * n, 6), np.float32) * scale,
                        "bias": rng.standard_normal((5,), np.float32)},
              "embed": rng.standard_normal((2 * n, 3)).astype(jax.numpy.bfloat16)}
    state = train_state.TrainState.create(apply_fn=len, params=global_tree(jd, params), tx=tx)
    grads = jax.tree.map(lambda x: x * 0.5 + 1, state.params)
    return state.apply_gradients(grads=grads)


def test_flax_train_state_with_adamw(comm, jd, root):
    jax = jd.jax
    tx = adamw(jd)
    state = trained_flax_state(jd, tx, 1.0)
    all_ok(comm, int(state.step) == 1, "one step taken")
    # The target the Flax docs build: a TrainState made afresh with the same
    # apply_fn and tx (other values), its arrays made abstract.
    target = abstract_of(jd, trained_flax_state(jd, tx, 0.0))

    with mhckpt.CheckpointManager(root + "/mhckpt") as mgr:
        mgr.save(1, state)
        mgr.wait_until_finished()
        out = mgr.restore(1, target)
    all_ok(comm, type(out) is type(state) and out.apply_fn is len and out.tx is target.tx,
           f"mhckpt: {type(out)}, apply_fn {out.apply_fn}")
    # The structure compared includes optax's state types (ScaleByAdamState,
    # MaskedState, EmptyState) and the TrainState's static fields.
    same_tree(comm, jd, out, state, "mhckpt")

    with ocp.CheckpointManager(root + "/orbax") as mngr:
        mngr.save(1, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
        out = mngr.restore(1, args=ocp.args.StandardRestore(target))
    all_ok(comm, type(out) is type(state), f"mhckpt.orbax: {type(out)}")
    same_tree(comm, jd, out, state, "mhckpt.orbax")


def nnx_model_and_state(jd, seed: int):
    from flax import nnx

    class Mlp(nnx.Module):
        def __init__(self, n: int, rngs: nnx.Rngs):
            self.up = nnx.Linear(3, 4 * n, rngs=rngs)
            self.norm = nnx.BatchNorm(4 * n, rngs=rngs)
            self.down = nnx.Linear(4 * n, 5, rngs=rngs)
            self.calls = nnx.Variable(jd.jax.numpy.array(seed, jd.jax.numpy.int32))

    def make():
        return Mlp(jd.size, nnx.Rngs(seed))

    graphdef, state = nnx.split(make())
    return make, graphdef, global_tree(jd, state)


def test_nnx_state_as_orbaxs_guide_saves_it(comm, jd, root):
    from flax import nnx
    import orbax.checkpoint as real_ocp

    make, graphdef, state = nnx_model_and_state(jd, seed=3)
    all_ok(comm, type(state) is nnx.State, f"{type(state)}")
    # The guide's restore target: eval_shape of the constructor, split, and
    # each abstract leaf given the sharding it is to have.
    _, abstract = nnx.split(nnx.eval_shape(make))
    shardings = jd.jax.tree.map(lambda x: x.sharding, state)
    abstract = jd.jax.tree.map(
        lambda a, s: jd.jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)

    ours = ocp.StandardCheckpointer()
    ours.save(root + "/ours/state", state)
    ours.wait_until_finished()
    got = ours.restore(root + "/ours/state", abstract)
    all_ok(comm, type(got) is nnx.State, f"mhckpt.orbax: {type(got)}")
    same_tree(comm, jd, got, state, "mhckpt.orbax")

    theirs = real_ocp.StandardCheckpointer()
    theirs.save(root + "/theirs/state", state)
    theirs.wait_until_finished()
    want = theirs.restore(root + "/theirs/state", abstract)
    same_tree(comm, jd, got, want, "mhckpt.orbax against Orbax")

    model = nnx.merge(graphdef, got)
    all_ok(comm, int(model.calls.value) == 3, "merged model")
    with mhckpt.CheckpointManager(root + "/mhckpt") as mgr:
        mgr.save(2, state)
        mgr.wait_until_finished()
        all_ok(comm, "up/kernel/value" in mgr.describe(2)["arrays"], "leaves named by key path")
        same_tree(comm, jd, mgr.restore(2, abstract), state, "mhckpt")


def test_equinox_module_partitioned(comm, jd, root):
    jax = jd.jax
    n = jd.size

    def make(seed):
        return eqx.nn.MLP(3, 2 * n, width_size=4 * n, depth=2, key=jax.random.PRNGKey(seed))

    model = make(11)
    # Equinox's way to checkpoint with Orbax: the arrays apart from the
    # static rest (activation functions, sizes), which the program rebuilds.
    params, static = eqx.partition(model, eqx.is_array)
    params = global_tree(jd, params)
    target_params, _ = eqx.partition(eqx.filter_eval_shape(make, 0),
                                     lambda x: isinstance(x, jax.ShapeDtypeStruct))
    shardings = jax.tree.map(lambda x: x.sharding, params)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          target_params, shardings)

    with mhckpt.CheckpointManager(root) as mgr:
        mgr.save(4, params)
        mgr.wait_until_finished()
        out = mgr.restore(4, target)
    all_ok(comm, type(out) is eqx.nn.MLP, f"{type(out)}")
    same_tree(comm, jd, out, params, "equinox")
    # The None leaves where the static parts were came back as None.
    all_ok(comm, out.activation is None and out.layers[0].weight is not None, "partition kept")
    # The rebuilt model computes what the saved one did (global arrays: passed
    # to the compiled call as arguments, compared shard by shard).
    call = eqx.filter_jit(lambda m, x: m(x))
    x = np.linspace(-1, 1, 3, dtype=np.float32)
    same_tree(comm, jd, call(eqx.combine(out, static), x),
              call(eqx.combine(params, static), x), "the restored model's output")
