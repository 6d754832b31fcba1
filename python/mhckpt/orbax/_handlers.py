"""The per-leaf save and restore arguments (``SaveArgs``, ``RestoreArgs``,
``ArrayRestoreArgs``), the checkpoint handlers, and the kind of item (tree
or JSON) that an args object, a handler or a checkpointer stands for."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from ._common import unsupported


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


def kind_of(x: Any) -> str:
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
