"""``mhckpt.orbax.args``: the arguments of ``save`` and ``restore``, as
``orbax.checkpoint.args`` names them.

A tree item (``StandardSave``/``PyTreeSave``, ``StandardRestore``/
``PyTreeRestore``) is a pytree of arrays and values; a JSON item
(``JsonSave``/``JsonRestore``) is a JSON-serializable value, stored in the
step's commit marker. ``Composite`` names several items of one step.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Optional

from ._common import unsupported


class CheckpointArgs:
    """Base class of the arguments below."""

    _fields: tuple = ()

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"


class StandardSave(CheckpointArgs):
    """Saves the pytree ``item``. ``save_args``: a pytree of ``SaveArgs``
    matching ``item`` (or a prefix of leaves of it)."""

    _fields = ("item", "save_args")

    def __init__(self, item: Any, save_args: Any = None, custom_metadata: Any = None):
        if custom_metadata is not None:
            raise unsupported(
                f"{type(self).__name__}(custom_metadata=...)",
                "store such values as a JSON item: args.Composite(..., meta=args.JsonSave(...))")
        self.item = item
        self.save_args = save_args


class PyTreeSave(StandardSave):
    """Saves the pytree ``item``; as :class:`StandardSave`."""

    def __init__(self, item: Any, save_args: Any = None, ocdbt_target_data_file_size: Optional[int] = None,
                 custom_metadata: Any = None):
        if ocdbt_target_data_file_size is not None:
            raise unsupported("PyTreeSave(ocdbt_target_data_file_size=...)",
                              "mhckpt writes one HDF5 file per step, not OCDBT")
        super().__init__(item, save_args, custom_metadata)


class StandardRestore(CheckpointArgs):
    """Restores a pytree item into the structure of ``item``: its leaves are
    ``jax.ShapeDtypeStruct`` (with a sharding: a ``jax.Array`` with that
    sharding), ``jax.Array`` (its sharding), numpy arrays (a new numpy array)
    or values; a leaf whose dtype differs from the stored one is cast after
    the read. ``item=None`` restores the whole item as nested dicts and lists
    of numpy arrays and values. The target names exactly the stored leaves of the item.
    ``strict=False`` is accepted; shapes must still match (mhckpt raises
    InvalidArgumentError naming the array otherwise)."""

    _fields = ("item", "strict")

    def __init__(self, item: Any = None, strict: bool = True, support_layout: bool = False,
                 fallback_sharding: Any = None):
        if support_layout:
            raise unsupported("StandardRestore(support_layout=True)", "device layouts are not stored")
        if fallback_sharding is not None:
            raise unsupported("StandardRestore(fallback_sharding=...)",
                              "give each leaf its sharding (jax.ShapeDtypeStruct(..., sharding=))")
        self.item = item
        self.strict = strict
        self.restore_args = None
        self.partial_restore = False


class PyTreeRestore(StandardRestore):
    """Restores a pytree item; ``restore_args``: a pytree of ``RestoreArgs``
    / ``ArrayRestoreArgs`` (restore type, dtype, sharding or mesh and
    mesh_axes per leaf). ``partial_restore=True``: the target may name a
    subset of the stored leaves."""

    _fields = ("item", "restore_args", "partial_restore")

    def __init__(self, item: Any = None, restore_args: Any = None, transforms: Any = None,
                 transforms_default_to_original: bool = True, legacy_transform_fn: Any = None,
                 partial_restore: bool = False):
        if transforms is not None or legacy_transform_fn is not None:
            raise unsupported("PyTreeRestore(transforms=...)",
                              "restore the stored tree, then reshape it in your code")
        super().__init__(item)
        self.restore_args = restore_args
        self.partial_restore = bool(partial_restore)


class JsonSave(CheckpointArgs):
    """Saves a JSON-serializable ``item`` (in the step's commit marker)."""

    _fields = ("item",)

    def __init__(self, item: Any):
        self.item = item


class JsonRestore(CheckpointArgs):
    """Restores a JSON item (``item`` is not used)."""

    _fields = ("item",)

    def __init__(self, item: Any = None):
        self.item = item


class Composite(CheckpointArgs, Mapping):
    """Several named items of one step: ``Composite(state=StandardSave(s),
    meta=JsonSave(m))``. ``restore`` returns a Composite of the restored
    items, read by key or attribute (``restored.state``)."""

    def __init__(self, **items: Any):
        for name in items:
            if name.startswith("_") or "/" in name:
                raise ValueError(f"item name {name!r}: names start with no '_' and hold no '/'")
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_items"][name]
        except KeyError:
            raise AttributeError(f"Composite has no item {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Composite is immutable")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"Composite({inner})"


def _unsupported_args(name: str):
    class _Unsupported(CheckpointArgs):
        def __init__(self, *a, **k):
            raise unsupported(f"args.{name}", "save such state as arrays of a tree item (StandardSave)")

    _Unsupported.__name__ = _Unsupported.__qualname__ = name
    return _Unsupported


ArraySave = _unsupported_args("ArraySave")
ArrayRestore = _unsupported_args("ArrayRestore")
ProtoSave = _unsupported_args("ProtoSave")
ProtoRestore = _unsupported_args("ProtoRestore")
JaxRandomKeySave = _unsupported_args("JaxRandomKeySave")
JaxRandomKeyRestore = _unsupported_args("JaxRandomKeyRestore")
NumpyRandomKeySave = _unsupported_args("NumpyRandomKeySave")
NumpyRandomKeyRestore = _unsupported_args("NumpyRandomKeyRestore")

__all__ = [
    "CheckpointArgs",
    "Composite",
    "JsonRestore",
    "JsonSave",
    "PyTreeRestore",
    "PyTreeSave",
    "StandardRestore",
    "StandardSave",
]
