"""``CheckpointManager.metadata()`` and ``item_metadata(step)``: Orbax's
shapes (``RootMetadata``, ``StepMetadata``, a tree of ``ArrayMetadata`` /
``ScalarMetadata`` / ``StringMetadata`` per tree item) built from what the
step's commit marker records (``mhckpt.CheckpointManager.describe``)."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import _pytree
from ._store import ITEMS_KEY, JSON_KEY, METRICS_KEY, SINGLE_KEY

# What Orbax records as each kind of item's handler.
_HANDLERS = {
    "tree": "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler",
    "json": "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler",
}


@dataclasses.dataclass
class ArrayMetadata:
    """An array leaf: its name (the path in the item), global shape and dtype.
    ``sharding`` and ``storage`` are None (mhckpt restores into any sharding)."""

    name: str
    directory: Any = None
    shape: Tuple[int, ...] = ()
    sharding: Any = None
    dtype: Any = None
    storage: Any = None


@dataclasses.dataclass
class ScalarMetadata(ArrayMetadata):
    """A Python number or bool leaf (an array of shape (), as in Orbax)."""


@dataclasses.dataclass
class StringMetadata:
    """A string leaf."""

    name: str
    directory: Any = None


@dataclasses.dataclass
class StepMetadata:
    """As Orbax's: the items' handlers and metadata, and the step's metrics."""

    item_handlers: Any = None
    item_metadata: Any = None
    metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    performance_metrics: Any = None
    init_timestamp_nsecs: Optional[int] = None
    commit_timestamp_nsecs: Optional[int] = None
    custom_metadata: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RootMetadata:
    """As Orbax's (mhckpt keeps no root metadata: both empty)."""

    internal_metadata: Optional[Dict[str, Any]] = dataclasses.field(default_factory=dict)
    custom_metadata: Optional[Dict[str, Any]] = dataclasses.field(default_factory=dict)


def _dtype(name: str) -> Any:
    try:
        return np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError, TypeError):
            return name


def _leaf(name: str, desc: Dict[str, Any]) -> Any:
    a = desc["arrays"].get(name)
    if a is not None:
        return ArrayMetadata(name=name, shape=tuple(int(s) for s in a["shape"]), dtype=_dtype(a["dtype"]))
    v = desc["values"].get(name)
    if isinstance(v, str):
        return StringMetadata(name=name)
    if isinstance(v, (bool, int, float)):
        return ScalarMetadata(name=name, dtype=np.asarray(v).dtype)
    return v  # None, or a value mhckpt stored as it is


def _tree(desc: Dict[str, Any], prefix: str) -> Any:
    names = [n for n in list(desc["arrays"]) + list(desc["values"]) if n.startswith(prefix)]
    tree = _pytree.tree_of_names([n[len(prefix):] for n in names])
    flat, treedef = _pytree.flatten(tree, lambda x: x is None)
    return _pytree.unflatten(treedef, [_leaf(prefix + _pytree.path_name(p), desc) for p, _ in flat])


def step_metadata(desc: Dict[str, Any], composite: Any) -> StepMetadata:
    """The StepMetadata of the step ``desc`` describes; ``composite`` makes
    the Composite of several items."""
    meta = desc["metadata"]
    items = meta.get(ITEMS_KEY)
    if items is None:  # a step saved by mhckpt's own API: one tree item, the whole state
        handlers, item = _HANDLERS["tree"], _tree(desc, "")
    else:
        per = {}
        for name, kind in items.items():
            per[name] = meta.get(JSON_KEY, {}).get(name) if kind == "json" else _tree(desc, f"{name}/")
        if meta.get(SINGLE_KEY) and len(items) == 1:
            (name, kind), = items.items()
            handlers, item = _HANDLERS.get(kind), per[name]
        else:
            handlers = {n: _HANDLERS.get(k) for n, k in items.items()}
            item = composite(**per)
    metrics = meta.get(METRICS_KEY)
    return StepMetadata(item_handlers=handlers, item_metadata=item,
                        metrics=dict(metrics) if isinstance(metrics, dict) else {},
                        commit_timestamp_nsecs=int(desc["created_unix_ms"]) * 1_000_000)


__all__ = ["ArrayMetadata", "ScalarMetadata", "StringMetadata", "StepMetadata", "RootMetadata"]
