"""Pytrees: nested dicts, lists, tuples and namedtuples of leaves.

With jax imported, ``jax.tree_util`` flattens (so registered pytree nodes such
as flax structs and optax states work); without it, a built-in flattener does.
Both name a leaf by its key path joined with ``/`` (``params/layer0/w``;
sequence items by index, namedtuple fields and attributes by name), so a
checkpoint saved with jax restores without it and back.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Tuple

Path = Tuple[str, ...]


def _is_leaf_default(x: Any) -> bool:
    return x is None


def _using_jax() -> bool:
    # sys.modules["jax"] is None where a program blocks jax's import.
    return sys.modules.get("jax") is not None


def _jax_key_name(entry: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


class _Node:
    """The structure of a built-in pytree: how to rebuild it from leaves."""

    def __init__(self, kind: str, meta: Any, children: List[Any]):
        self.kind, self.meta, self.children = kind, meta, children


def _flatten_builtin(x: Any, path: Path, out: List[Tuple[Path, Any]], is_leaf) -> Any:
    if not is_leaf(x):
        if isinstance(x, dict):
            keys = sorted(x.keys(), key=str)
            kids = [_flatten_builtin(x[k], path + (str(k),), out, is_leaf) for k in keys]
            return _Node("dict", (type(x), keys), kids)
        if _is_namedtuple(x):
            kids = [_flatten_builtin(getattr(x, f), path + (f,), out, is_leaf) for f in x._fields]
            return _Node("namedtuple", type(x), kids)
        if isinstance(x, (list, tuple)):
            kids = [_flatten_builtin(v, path + (str(i),), out, is_leaf) for i, v in enumerate(x)]
            return _Node("list" if isinstance(x, list) else "tuple", None, kids)
    out.append((path, x))
    return _Node("leaf", None, [])


def _unflatten_builtin(node: _Node, leaves) -> Any:
    if node.kind == "leaf":
        return next(leaves)
    kids = [_unflatten_builtin(c, leaves) for c in node.children]
    if node.kind == "dict":
        cls, keys = node.meta
        d = dict(zip(keys, kids))
        return d if cls is dict else cls(d)
    if node.kind == "namedtuple":
        return node.meta(*kids)
    return kids if node.kind == "list" else tuple(kids)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] = _is_leaf_default):
    """Returns ``([(path, leaf), ...], treedef)``; ``None`` counts as a leaf."""
    if _using_jax():
        import jax

        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
        return [(tuple(_jax_key_name(k) for k in path), leaf) for path, leaf in leaves], (
            "jax",
            treedef,
        )
    out: List[Tuple[Path, Any]] = []
    node = _flatten_builtin(tree, (), out, is_leaf)
    return out, ("builtin", node)


def unflatten(treedef, leaves: List[Any]) -> Any:
    """The inverse of :func:`flatten`."""
    kind, d = treedef
    if kind == "jax":
        import jax

        return jax.tree_util.tree_unflatten(d, leaves)
    return _unflatten_builtin(d, iter(leaves))


def path_name(path: Path) -> str:
    """``("params", "w")`` -> ``"params/w"``; the root leaf is ``"value"``."""
    return "/".join(path) if path else "value"


def tree_of_names(names) -> dict:
    """Nested dicts with a None leaf at each '/'-separated name
    (``["a/b", "c"]`` -> ``{"a": {"b": None}, "c": None}``): the target
    that restores every named leaf."""
    root: dict = {}
    for name in names:
        parts = name.split("/")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = None
    return root
