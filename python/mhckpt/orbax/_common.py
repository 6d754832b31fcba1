"""Helpers of mhckpt.orbax."""
from __future__ import annotations

from .._errors import UnsupportedError

# The name of the one item of a step saved without item names (Orbax's).
DEFAULT_ITEM_NAME = "default"


def unsupported(feature: str, hint: str = "") -> UnsupportedError:
    """The error for an Orbax feature that mhckpt.orbax does not provide."""
    return UnsupportedError(f"mhckpt.orbax does not support {feature}" + (f": {hint}" if hint else ""))
