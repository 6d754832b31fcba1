"""``mhckpt.Shard``: a numpy array that is one box of a larger global array."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Tuple


@dataclass(frozen=True)
class Shard:
    """This rank's piece of a global array, for state kept in numpy.

    Args:
      local: the rank's block, any shape ``count`` (its own shape).
      offset: where ``local`` starts in the global array, one index per dim.
      global_shape: the shape of the whole array.

    As a leaf of ``save``'s state, every rank passes its own ``Shard`` of the
    same global array (same name, dtype and ``global_shape``); ranks holding
    the same box are replicas, and one of them writes it. As a leaf of
    ``restore``'s target, ``local`` is filled in place with the box at
    ``offset`` (any box: the sharding at restore need not match the save's).
    """

    local: Any
    offset: Tuple[int, ...]
    global_shape: Tuple[int, ...]

    def __init__(self, local: Any, offset: Sequence[int], global_shape: Sequence[int]):
        object.__setattr__(self, "local", local)
        object.__setattr__(self, "offset", tuple(int(o) for o in offset))
        object.__setattr__(self, "global_shape", tuple(int(s) for s in global_shape))
