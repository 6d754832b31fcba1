"""``mhckpt.orbax.checkpoint_utils``: Orbax's helpers for restore targets."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .._errors import UnsupportedError
from . import _handlers


def construct_restore_args(target: Any, sharding_tree: Optional[Any] = None, set_global_shape: bool = True,
                           support_layout: bool = False, strict: bool = True) -> Any:
    """A tree of ``ArrayRestoreArgs`` (jax leaves: the leaf's sharding, or
    ``sharding_tree``'s) and ``RestoreArgs`` (other leaves) for ``target``."""
    if support_layout:
        raise UnsupportedError("mhckpt.orbax does not support construct_restore_args(support_layout=True)")
    import jax

    def one(leaf, sharding=None):
        if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
            return _handlers.ArrayRestoreArgs(
                sharding=sharding if sharding is not None else getattr(leaf, "sharding", None),
                global_shape=tuple(leaf.shape) if set_global_shape else None, dtype=leaf.dtype, strict=strict,
            )
        if isinstance(leaf, (np.ndarray, np.generic)):
            return _handlers.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype)
        return _handlers.RestoreArgs()

    if sharding_tree is None:
        return jax.tree_util.tree_map(one, target)
    return jax.tree_util.tree_map(one, target, sharding_tree)
