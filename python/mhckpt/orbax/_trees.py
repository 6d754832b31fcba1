"""Pytree helpers of the Orbax drop-in: per-leaf arguments matched to an
item's leaves, a save's dtype casts, the restore target of each leaf, JSON
values made plain, and the lists and tuples of a tree (mhckpt stores them
as dicts keyed by index) recorded at save and given back at restore."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _leaves, _pytree
from .._errors import InvalidArgumentError
from ._common import unsupported


def _is_args_leaf(x: Any) -> bool:
    return x is None or hasattr(x, "aggregate") or hasattr(x, "restore_type")


def args_by_name(tree: Any, item: str, what: str, names: set) -> Dict[str, Any]:
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


def apply_save_args(item: str, tree: Any, save_args: Any) -> Any:
    flat, treedef = _pytree.flatten(tree, _leaves.is_leaf)
    names = [_pytree.path_name(p) for p, _ in flat]
    by_name = args_by_name(save_args, item, "save_args", set(names))
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


def restore_target(name: str, leaf: Any, rargs: Any, stored: Optional[dict]):
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


def cast(x: Any, dtype: Any) -> Any:
    return x if dtype is None else x.astype(dtype)


def json_safe(what: str, v: Any) -> Any:
    """``v`` with numpy / jax scalars made Python numbers (metrics are often
    jax scalars)."""
    if isinstance(v, Mapping):
        return {str(k): json_safe(what, x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(what, x) for x in v]
    if hasattr(v, "shape") and hasattr(v, "dtype") and tuple(v.shape) == ():
        return np.asarray(v).item()
    return v


def sequence_paths(tree: Any, path: Tuple[str, ...]) -> List[str]:
    """The paths of the lists and tuples in a tree of dicts, lists and tuples
    (namedtuples and other nodes are not followed)."""
    out: List[str] = []
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            out += sequence_paths(v, path + (str(k),))
    elif isinstance(tree, (list, tuple)) and not hasattr(type(tree), "_fields"):
        if tree:
            out.append("/".join(path))
        for i, v in enumerate(tree):
            out += sequence_paths(v, path + (str(i),))
    return out


def as_sequences(tree: Any, paths: List[str]) -> Any:
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
