"""mhckpt.orbax: Orbax's checkpointing API, saved and restored by mhckpt.

    import mhckpt.orbax as ocp            # instead of: import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=3, save_interval_steps=100)
    with ocp.CheckpointManager("/ckpt/run1", options=options) as mngr:
        mngr.save(step, args=ocp.args.StandardSave(state))
        ...
        state = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(abstract_state))

The older style, ``CheckpointManager(directory, ocp.AsyncCheckpointer(
ocp.PyTreeCheckpointHandler()), options)`` with ``save(step, items,
save_kwargs={'save_args': save_args})`` and ``restore(step, items=target,
restore_kwargs={'restore_args': ...})``, works too. ``SaveArgs(aggregate=True)``
is honoured like every other leaf: ``save`` returns once each local buffer is
copied into mhckpt's memory, so the arrays may be donated at once (no "Array
has been deleted" in a background writer).

The checkpoints are mhckpt's own (one directory per step under
``directory``; docs/FORMAT.md), not Orbax's files. Every Orbax argument that
would change what is stored or read and that mhckpt does not provide raises
:class:`mhckpt.UnsupportedError` naming it; none is ignored. See
docs/PYTHON.md, "Coming from Orbax".

Processes: the job runs under mpirun, one MPI rank per JAX process (MPI's
rank i is ``jax.process_index()`` i); the manager's collective calls are
made by every process in the same order, as with Orbax.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _leaves, _pytree
from .._errors import InvalidArgumentError, NotFoundError, UnsupportedError
from .._manager import CheckpointManager as _Manager
from . import args, checkpoint_utils
from ._common import unsupported
from .args import Composite

DEFAULT_ITEM_NAME = "default"

# Keys of the commit marker's metadata (mhckpt's user metadata) written here.
_ITEMS_KEY = "orbax.items"  # {item name: "tree" | "json"}
_SINGLE_KEY = "orbax.single"  # saved without item names (one "default" item)
_JSON_KEY = "orbax.json"  # {item name: JSON item}
_METRICS_KEY = "orbax.metrics"
_SEQUENCES_KEY = "orbax.sequences"  # {item name: paths of its lists and tuples}


class StepAlreadyExistsError(ValueError):
    """``save`` of a step that is already committed (Orbax's error)."""


# ---------------------------------------------------------------- options


@dataclasses.dataclass
class AsyncOptions:
    """As Orbax's; ``timeout_secs`` bounds each collective phase of a save
    (mhckpt's ``collective_timeout_seconds``: the job is aborted past it)."""

    timeout_secs: int = 1200
    barrier_sync_fn: Any = None
    post_finalization_callback: Any = None
    create_directories_asynchronously: bool = True


@dataclasses.dataclass
class MultiprocessingOptions:
    """As Orbax's; only the defaults (every process takes part) are supported."""

    primary_host: Optional[int] = 0
    active_processes: Optional[set] = None
    barrier_sync_key_prefix: Optional[str] = None


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Orbax's ``CheckpointManagerOptions``, field for field.

    Supported: ``save_interval_steps``, ``save_on_steps``, ``should_save_fn``,
    ``max_to_keep``, ``keep_period``, ``read_only``, ``create``,
    ``enable_async_checkpointing``, ``async_options.timeout_secs``,
    ``prevent_write_metrics``, and fields that change only how Orbax does its
    own bookkeeping (``cleanup_tmp_directories``: mhckpt always removes
    uncommitted steps when a manager opens; ``enable_background_delete``,
    ``num_deletion_threads``: mhckpt deletes in the background;
    ``single_host_load_and_broadcast``: mhckpt reads a box wanted by several
    processes once and sends it; ``save_root_metadata``,
    ``enable_should_save_is_saving_in_progress_check``). Any other field set
    to other than its default raises UnsupportedError when the manager is made.
    """

    save_interval_steps: int = 1
    max_to_keep: Optional[int] = None
    keep_time_interval: Any = None
    keep_period: Optional[int] = None
    best_fn: Optional[Callable[[Any], float]] = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: Optional[str] = None
    step_format_fixed_length: Optional[int] = None
    step_name_format: Any = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Optional[Sequence[int]] = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: Optional[str] = None
    todelete_full_path: Optional[str] = None
    enable_background_delete: bool = False
    num_deletion_threads: Optional[int] = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: Optional[AsyncOptions] = None
    multiprocessing_options: MultiprocessingOptions = dataclasses.field(
        default_factory=MultiprocessingOptions)
    should_save_fn: Optional[Callable[[int, Optional[int]], bool]] = None
    file_options: Any = None
    atomicity_options: Any = None
    save_root_metadata: bool = True
    temporary_path_class: Any = None
    save_decision_policy: Any = None
    preservation_policy: Any = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False


# field -> why it is not supported
_UNSUPPORTED_OPTIONS = {
    "keep_time_interval": "keeping steps by time (keep_period keeps steps by number)",
    "best_fn": "keeping the best steps by a metric",
    "best_mode": "keeping the best steps by a metric",
    "keep_checkpoints_without_metrics": "keeping the best steps by a metric",
    "step_prefix": "mhckpt names step directories itself",
    "step_format_fixed_length": "mhckpt names step directories itself",
    "step_name_format": "mhckpt names step directories itself",
    "todelete_subdir": "old steps are deleted, not moved",
    "todelete_full_path": "old steps are deleted, not moved",
    "save_decision_policy": "use save_interval_steps, save_on_steps or should_save_fn",
    "preservation_policy": "use max_to_keep and keep_period",
    "temporary_path_class": "mhckpt commits with its own marker",
    "atomicity_options": "mhckpt commits with its own marker",
    "enable_per_process_directory_creation": "",
    "lightweight_initialize": "",
}


def _check_options(o: Any) -> CheckpointManagerOptions:
    """Our options from ours or Orbax's own (any dataclass with these fields)."""
    if o is None:
        return CheckpointManagerOptions()
    if not dataclasses.is_dataclass(o):
        raise TypeError(f"options must be a CheckpointManagerOptions, not {type(o).__qualname__}")
    defaults = CheckpointManagerOptions()
    values = {}
    for f in dataclasses.fields(o):
        if not hasattr(defaults, f.name):
            raise unsupported(f"CheckpointManagerOptions.{f.name}")
        values[f.name] = getattr(o, f.name)
    for name, why in _UNSUPPORTED_OPTIONS.items():
        if name in values and values[name] != getattr(defaults, name):
            raise unsupported(f"CheckpointManagerOptions({name}={values[name]!r})", why)
    fo = values.get("file_options")
    if fo is not None and any(
        getattr(fo, k, None) not in (None, False)
        for k in ("path_permission_mode", "skip_sync_file_validations")
    ):
        raise unsupported(f"CheckpointManagerOptions(file_options={fo!r})")
    mp = values.get("multiprocessing_options")
    if mp is not None and (
        getattr(mp, "primary_host", 0) not in (0, None)
        or getattr(mp, "active_processes", None) is not None
        or getattr(mp, "barrier_sync_key_prefix", None) is not None
    ):
        raise unsupported(f"CheckpointManagerOptions(multiprocessing_options={mp!r})",
                          "every process of the job takes part, process 0 leads")
    ao = values.get("async_options")
    if ao is not None and (
        getattr(ao, "barrier_sync_fn", None) is not None
        or getattr(ao, "post_finalization_callback", None) is not None
    ):
        raise unsupported("AsyncOptions(barrier_sync_fn=..., post_finalization_callback=...)",
                          "wait_until_finished() returns once the step is committed")
    out = CheckpointManagerOptions(**values)
    if out.save_interval_steps is not None and out.save_interval_steps < 0:
        raise ValueError("save_interval_steps must be >= 0")
    return out


# ---------------------------------------------------------- save and restore args


@dataclasses.dataclass
class SaveArgs:
    """Per-leaf save arguments. ``aggregate`` is accepted either way (the
    leaf is saved and restored the same); ``dtype`` casts the leaf before it
    is saved. ``chunk_byte_size`` and ``shard_axes`` (Orbax's storage layout)
    raise UnsupportedError."""

    aggregate: bool = False
    dtype: Any = None
    chunk_byte_size: Optional[int] = None
    shard_axes: tuple = ()


@dataclasses.dataclass
class RestoreArgs:
    """Per-leaf restore arguments: ``restore_type`` np.ndarray (or None: the
    target leaf decides), ``dtype``: cast after the read."""

    restore_type: Any = None
    dtype: Any = None


@dataclasses.dataclass
class ArrayRestoreArgs(RestoreArgs):
    """Restore a leaf as a ``jax.Array`` with ``sharding`` (or
    ``NamedSharding(mesh, PartitionSpec(*mesh_axes))``); ``global_shape`` and
    ``shape``, if given, must be the stored shape."""

    restore_type: Any = "jax.Array"
    dtype: Any = None
    mesh: Any = None
    mesh_axes: Any = None
    sharding: Any = None
    global_shape: Optional[Tuple[int, ...]] = None
    shape: Optional[Tuple[int, ...]] = None
    strict: bool = True


def _is_args_leaf(x: Any) -> bool:
    return x is None or hasattr(x, "aggregate") or hasattr(x, "restore_type")


def _args_by_name(tree: Any, item: str, what: str, names: set) -> Dict[str, Any]:
    """{leaf name: SaveArgs/RestoreArgs} of a tree of per-leaf arguments; a
    leaf of the arguments tree that is a prefix of the item's names applies
    to every leaf under it."""
    if tree is None:
        return {}
    out: Dict[str, Any] = {}
    flat, _ = _pytree.flatten(tree, _is_args_leaf)
    for path, a in flat:
        if a is None:
            continue
        if not (hasattr(a, "aggregate") or hasattr(a, "restore_type")):
            raise InvalidArgumentError(
                f"item '{item}': {what} leaf {_pytree.path_name(path)!r} is a {type(a).__qualname__}, "
                "not SaveArgs/RestoreArgs"
            )
        prefix = "/".join(path)
        hit = [n for n in names if n == prefix or not path or n.startswith(prefix + "/")]
        if not hit:
            raise InvalidArgumentError(
                f"item '{item}': {what} has a leaf at {prefix!r}, where the item has none"
            )
        for n in hit:
            out[n] = a
    return out


def _apply_save_args(item: str, tree: Any, save_args: Any) -> Any:
    flat, treedef = _pytree.flatten(tree, _leaves.is_leaf)
    names = [_pytree.path_name(p) for p, _ in flat]
    by_name = _args_by_name(save_args, item, "save_args", set(names))
    if not by_name:
        return tree
    out = []
    for name, (_, leaf) in zip(names, flat):
        sa = by_name.get(name)
        if sa is not None:
            if getattr(sa, "chunk_byte_size", None) is not None:
                raise unsupported(f"SaveArgs(chunk_byte_size=...) (leaf '{item}/{name}')",
                                  "mhckpt stores each array contiguously")
            if tuple(getattr(sa, "shard_axes", ()) or ()):
                raise unsupported(f"SaveArgs(shard_axes=...) (leaf '{item}/{name}')",
                                  "mhckpt stores each array contiguously")
            dtype = getattr(sa, "dtype", None)
            if dtype is not None and hasattr(leaf, "astype") and np.dtype(leaf.dtype) != np.dtype(dtype):
                leaf = leaf.astype(dtype)
        out.append(leaf)
    return _pytree.unflatten(treedef, out)


def _jax():
    import jax

    return jax


def _restore_target(name: str, leaf: Any, rargs: Any, stored: Optional[dict]):
    """(what mhckpt.CheckpointManager.restore takes for this leaf, the dtype
    to cast the result to or None)."""
    if stored is None:  # a value leaf, or missing: mhckpt answers
        return leaf, None
    stored_dtype = _leaves.numpy_dtype(stored["dtype"])
    shape = tuple(stored["shape"])
    want_jax, sharding, dtype = False, None, None
    if rargs is not None:
        dtype = getattr(rargs, "dtype", None)
        rtype = getattr(rargs, "restore_type", None)
        for attr in ("global_shape", "shape"):
            s = getattr(rargs, attr, None)
            if s is not None and tuple(s) != shape:
                raise unsupported(f"ArrayRestoreArgs({attr}={tuple(s)}) (leaf '{name}', stored {shape})",
                                  "padding or truncating arrays")
        mesh, axes = getattr(rargs, "mesh", None), getattr(rargs, "mesh_axes", None)
        sharding = getattr(rargs, "sharding", None)
        if sharding is None and mesh is not None:
            jax = _jax()
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*(axes or ())))
        if rtype is np.ndarray:
            want_jax = False
        elif rtype is None:
            want_jax = sharding is not None or _leaves.is_jax_array(leaf) or _leaves.is_jax_struct(leaf)
            if sharding is None and want_jax:
                sharding = getattr(leaf, "sharding", None)
        elif rtype == "jax.Array" or getattr(rtype, "__module__", "").startswith("jax"):
            want_jax = True
            if sharding is None:
                sharding = getattr(leaf, "sharding", None)
        else:
            raise unsupported(f"RestoreArgs(restore_type={rtype!r}) (leaf '{name}')",
                              "leaves restore as jax.Array or np.ndarray")
        if dtype is None and hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
            dtype = leaf.dtype
    elif _leaves.is_jax_array(leaf) or _leaves.is_jax_struct(leaf):
        want_jax, sharding, dtype = True, getattr(leaf, "sharding", None), leaf.dtype
    elif isinstance(leaf, (np.ndarray, np.generic)):
        dtype = leaf.dtype
    elif _leaves.is_torch_tensor(leaf):
        raise InvalidArgumentError(f"leaf '{name}': a torch.Tensor target; use mhckpt.torch for torch state")
    if dtype is not None and np.dtype(dtype) == stored_dtype:
        dtype = None
    if want_jax:
        return _jax().ShapeDtypeStruct(shape, stored_dtype, sharding=sharding), dtype
    return None, dtype  # a new numpy array


def _cast(x: Any, dtype: Any) -> Any:
    return x if dtype is None else x.astype(dtype)


def _json_safe(what: str, v: Any) -> Any:
    """``v`` with numpy / jax scalars made Python numbers (metrics are often
    jax scalars)."""
    if isinstance(v, Mapping):
        return {str(k): _json_safe(what, x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(what, x) for x in v]
    if hasattr(v, "shape") and hasattr(v, "dtype") and tuple(v.shape) == ():
        return np.asarray(v).item()
    return v


# ------------------------------------------------------------------ handlers


class _Handler:
    kind = "tree"

    def __init__(self, *a, **k):
        given = [repr(x) for x in a] + [f"{key}={v!r}" for key, v in k.items()]
        if given:
            raise unsupported(f"{type(self).__name__}({', '.join(given)})",
                              "Orbax's storage options; mhckpt writes its own format")


class PyTreeCheckpointHandler(_Handler):
    """A pytree item (``PyTreeSave``/``PyTreeRestore``)."""


class StandardCheckpointHandler(_Handler):
    """A pytree item (``StandardSave``/``StandardRestore``)."""


class JsonCheckpointHandler(_Handler):
    """A JSON item (``JsonSave``/``JsonRestore``)."""

    kind = "json"


def _kind_of(x: Any) -> str:
    """'tree' or 'json' for an args object, a handler or a checkpointer (ours
    or Orbax's own, by class name)."""
    handler = getattr(x, "handler", x)
    n = type(handler).__name__
    if n.endswith("Args"):  # Orbax's own args classes (StandardSaveArgs, ...)
        for attr in ("custom_metadata", "transforms", "legacy_transform_fn", "fallback_sharding",
                     "support_layout", "ocdbt_target_data_file_size"):
            if getattr(handler, attr, None):
                raise unsupported(f"{n}({attr}=...)")
        n = n[: -len("Args")]
    if n in ("JsonSave", "JsonRestore", "JsonCheckpointHandler"):
        return "json"
    if n in ("StandardSave", "StandardRestore", "PyTreeSave", "PyTreeRestore", "StandardCheckpointHandler",
             "PyTreeCheckpointHandler", "PyTreeCheckpointer", "StandardCheckpointer"):
        return "tree"
    raise unsupported(f"{n} items", "items are pytrees (Standard/PyTree) or JSON")


# ---------------------------------------------------------------- the store


class _Store:
    """Items <-> one mhckpt step: tree items are the top-level keys of the
    saved state, JSON items and Orbax's bookkeeping go into the marker."""

    def __init__(self, mgr: _Manager):
        self.mgr = mgr

    def save(self, step: int, items: Dict[str, Tuple[str, Any, Any]], single: bool,
             metrics: Any = None) -> None:
        """items: {name: (kind, item, save_args)}."""
        state: Dict[str, Any] = {}
        js: Dict[str, Any] = {}
        sequences: Dict[str, List[str]] = {}
        for name, (kind, item, save_args) in items.items():
            if kind == "json":
                js[name] = item
            else:
                state[name] = _apply_save_args(name, item, save_args)
                seqs = _sequence_paths(item, ())
                if seqs:
                    sequences[name] = seqs
        meta = {_ITEMS_KEY: {n: k for n, (k, _, _) in items.items()}, _SINGLE_KEY: single}
        if sequences:  # so that a restore without a target gives lists back
            meta[_SEQUENCES_KEY] = sequences
        if js:
            meta[_JSON_KEY] = _json_safe("JSON item", js)
        if metrics is not None:
            meta[_METRICS_KEY] = _json_safe("metrics", metrics)
        self.mgr.save(step, state, metadata=meta)

    def layout(self, step: int) -> Tuple[Dict[str, Any], Dict[str, str], bool]:
        desc = self.mgr.describe(step)
        items = desc["metadata"].get(_ITEMS_KEY)
        if items is None:  # a step saved by mhckpt's own API: one item, the whole state
            return desc, {"": "tree"}, True
        return desc, items, bool(desc["metadata"].get(_SINGLE_KEY))

    def restore(self, step: int, requests: Dict[str, Tuple[Any, Any, bool]]) -> Dict[str, Any]:
        """requests: {name: (target or None, restore_args, partial)}; the
        name "" is a whole mhckpt step. Returns {name: restored item}."""
        desc, items, _ = self.layout(step)
        arrays, values = desc["arrays"], desc["values"]
        out: Dict[str, Any] = {}
        combined: Dict[str, Any] = {}
        casts: Dict[str, Tuple[Any, List[Any]]] = {}
        for name, (target, restore_args, partial) in requests.items():
            kind = items.get(name)
            if kind is None:
                raise NotFoundError(f"step {step} has no item '{name}' (it has {sorted(items)})")
            if kind == "json":
                out[name] = desc["metadata"].get(_JSON_KEY, {}).get(name)
                continue
            prefix = f"{name}/" if name else ""
            stored_names = {n[len(prefix):] for n in list(arrays) + list(values) if n.startswith(prefix)}
            whole = target is None
            if whole:
                target = _default_tree(stored_names)
            flat, treedef = _pytree.flatten(target, _leaves.is_leaf)
            names = [_pytree.path_name(p) for p, _ in flat]
            if not (partial or set(names) == stored_names):
                missing, extra = sorted(stored_names - set(names)), sorted(set(names) - stored_names)
                raise InvalidArgumentError(
                    f"restore of item '{name or DEFAULT_ITEM_NAME}' at step {step}: the target's tree is "
                    f"not the stored one (stored leaves it lacks: {missing[:8]}; leaves not stored: "
                    f"{extra[:8]}); PyTreeRestore(partial_restore=True) restores a subset"
                )
            rargs = _args_by_name(restore_args, name, "restore_args", set(names))
            leaves, dtypes = [], []
            for n, (_, leaf) in zip(names, flat):
                t, dt = _restore_target(prefix + n, leaf, rargs.get(n), arrays.get(prefix + n))
                leaves.append(t)
                dtypes.append(dt)
            combined[name] = _pytree.unflatten(treedef, leaves)
            seqs = desc["metadata"].get(_SEQUENCES_KEY, {}).get(name) if whole else None
            casts[name] = (treedef, dtypes, seqs)
        if combined:
            target = combined[""] if "" in combined else combined
            restored = self.mgr.restore(step, target)
            for name, (treedef, dtypes, seqs) in casts.items():
                got, _ = _pytree.flatten(restored[name] if name else restored, _leaves.is_leaf)
                out[name] = _pytree.unflatten(treedef, [_cast(x, dt) for (_, x), dt in zip(got, dtypes)])
                if seqs:
                    out[name] = _as_sequences(out[name], seqs)
        return out


def _sequence_paths(tree: Any, path: Tuple[str, ...]) -> List[str]:
    """The paths of the lists and tuples in a tree of dicts, lists and tuples
    (namedtuples and other nodes are not followed)."""
    out: List[str] = []
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out += _sequence_paths(v, path + (str(k),))
    elif isinstance(tree, (list, tuple)) and not hasattr(type(tree), "_fields"):
        if tree:
            out.append("/".join(path))
        for i, v in enumerate(tree):
            out += _sequence_paths(v, path + (str(i),))
    return out


def _as_sequences(tree: Any, paths: List[str]) -> Any:
    """Turns the dicts at ``paths`` (keyed "0", "1", ...) back into lists,
    innermost first."""
    for p in sorted(paths, key=lambda p: -len(p.split("/")) if p else 0):
        keys = p.split("/") if p else []
        parent, node = None, tree
        try:
            for k in keys:
                parent, node = node, node[k]
        except (KeyError, TypeError):
            continue  # not restored (a partial tree)
        if not isinstance(node, dict) or sorted(node) != sorted(str(i) for i in range(len(node))):
            continue
        seq = [node[str(i)] for i in range(len(node))]
        if parent is None:
            tree = seq
        else:
            parent[keys[-1]] = seq
    return tree


def _default_tree(names) -> Dict[str, Any]:
    root: Dict[str, Any] = {}
    for name in names:
        parts = name.split("/")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = None
    return root


# ------------------------------------------------------------- checkpointers


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
        _kind_of(self.handler)
        self._comm = comm
        self._open: List[_Manager] = []  # saves of an AsyncCheckpointer not waited for yet

    @staticmethod
    def _default_handler():
        return PyTreeCheckpointHandler()

    def _kind(self, a: Any) -> str:
        return _kind_of(a) if a is not None else _kind_of(self.handler)

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
            _Store(mgr).save(step, {DEFAULT_ITEM_NAME: (kind, item, save_args)}, True)
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
            store = _Store(mgr)
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


# ------------------------------------------------------------------ manager


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

    ``metadata``, ``item_handlers``, ``logger`` and ``handler_registry``
    raise UnsupportedError when given.
    """

    def __init__(self, directory: Any, checkpointers: Any = None, options: Any = None, metadata: Any = None,
                 item_names: Optional[Sequence[str]] = None, item_handlers: Any = None, logger: Any = None,
                 handler_registry: Any = None, *, comm: Any = None):
        for arg, v in (("metadata", metadata), ("item_handlers", item_handlers), ("logger", logger),
                       ("handler_registry", handler_registry)):
            if v is not None:
                raise unsupported(f"CheckpointManager({arg}=...)")
        self._options = o = _check_options(options)
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
                _kind_of(c)
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
        self._mgr = _Manager(
            str(self._directory), comm, max_to_keep=o.max_to_keep or 0, keep_period=o.keep_period or 0,
            async_save=async_save, own_root=not o.read_only, collective_timeout_seconds=float(timeout),
        )
        self._store = _Store(self._mgr)
        self._pending: Optional[int] = None  # the last step saved, until it is seen committed

    # --------------------------------------------------------------- catalogue

    @property
    def directory(self) -> pathlib.Path:
        return self._directory

    def all_steps(self, read: bool = False) -> List[int]:
        """The committed steps, and the one being saved in the background."""
        steps = self._mgr.all_steps()
        if self._pending is not None and self._pending not in steps:
            steps = sorted(steps + [self._pending])
        return steps

    def latest_step(self) -> Optional[int]:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def reload(self) -> None:
        """Nothing to do: the steps are read from the directory at each call."""

    def should_save(self, step: int) -> bool:
        """True if ``step`` is newer than the latest step and the options'
        interval (``save_interval_steps``, ``save_on_steps``,
        ``should_save_fn``) asks for it, or no step was saved yet."""
        o = self._options
        if o.read_only:
            return False
        last = self.latest_step()
        if last is not None and last >= step:
            return False
        if o.should_save_fn is not None:
            return bool(o.should_save_fn(step, last))
        if last is None:
            return True
        if o.save_interval_steps and step % o.save_interval_steps == 0:
            return True
        return o.save_on_steps is not None and step in set(o.save_on_steps)

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
        if step in self.all_steps():
            raise StepAlreadyExistsError(f"Checkpoint for step {step} already exists.")
        request, single = self._save_request(items, save_kwargs, args)
        if self._options.prevent_write_metrics:
            metrics = None
        self._store.save(step, request, single, metrics)
        self._pending = step
        return True

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
            request = {n: (_kind_of(x), x.item, getattr(x, "save_args", None)) for n, x in parts.items()}
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
            out[name] = (_kind_of(self._legacy[name]), item, sa)
        return out, self._single

    def wait_until_finished(self) -> None:
        """Waits for the background save; raises its failure (mhckpt.Error)."""
        try:
            self._mgr.wait_until_finished()
        finally:
            self._pending = None

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
        if step == self._pending:
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
        return self._mgr.describe(int(step))["metadata"].get(_METRICS_KEY)

    def _unsupported_method(name: str, hint: str = ""):
        def method(self, *a, **k):
            raise unsupported(f"CheckpointManager.{name}", hint)

        method.__name__ = name
        return method

    best_step = _unsupported_method("best_step", "keeping the best steps by a metric")
    delete = _unsupported_method("delete", "old steps go by max_to_keep and keep_period")
    item_metadata = _unsupported_method("item_metadata", "mhckpt.CheckpointManager.describe(step) tells it")
    metadata = _unsupported_method("metadata")
    reached_preemption = _unsupported_method("reached_preemption")
    is_saving_in_progress = _unsupported_method("is_saving_in_progress")
    del _unsupported_method

    def close(self) -> None:
        """Waits for a pending save, raising its failure as Orbax does, and
        releases the manager (collective)."""
        try:
            if not self._mgr._impl.closed():
                self.wait_until_finished()
        finally:
            self._mgr.close()
            self._pending = None

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:  # the block's exception, not a save's, goes on
            self._mgr.close()
            self._pending = None

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
    kind = _kind_of(a)
    if name in saved and saved[name] != kind:
        raise ValueError(f"item '{name}' was saved as a {saved[name]} item, restored as a {kind} item")
    partial = bool(getattr(a, "partial_restore", False))
    return getattr(a, "item", None), getattr(a, "restore_args", None), partial


__all__ = [
    "ArrayRestoreArgs",
    "AsyncCheckpointer",
    "AsyncOptions",
    "CheckpointManager",
    "CheckpointManagerOptions",
    "Checkpointer",
    "Composite",
    "JsonCheckpointHandler",
    "MultiprocessingOptions",
    "PyTreeCheckpointHandler",
    "PyTreeCheckpointer",
    "RestoreArgs",
    "SaveArgs",
    "StandardCheckpointHandler",
    "StandardCheckpointer",
    "StepAlreadyExistsError",
    "UnsupportedError",
    "args",
    "checkpoint_utils",
]
