"""Helpers of mhckpt.orbax."""
from __future__ import annotations

from .._errors import UnsupportedError


def unsupported(feature: str, hint: str = "") -> UnsupportedError:
    """The error for an Orbax feature that mhckpt.orbax does not provide."""
    return UnsupportedError(f"mhckpt.orbax does not support {feature}" + (f": {hint}" if hint else ""))
