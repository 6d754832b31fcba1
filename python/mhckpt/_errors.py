"""Exceptions raised by mhckpt: one class per C++ StatusCode.

Every collective call raises the same exception, with the same message, on
every rank: the C++ core agrees on errors before it returns.
"""
from __future__ import annotations

from . import _core


class Error(Exception):
    """Base class of every mhckpt error.

    Attributes:
      code: the C++ StatusCode name, e.g. ``"DATA_LOSS"``.
      message: the message, naming the array, the rank and the box.
    """

    code = "UNKNOWN"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgumentError(Error, ValueError):
    """Bad input from the caller: a shape, box, name, dtype or leaf."""

    code = "INVALID_ARGUMENT"


class UnsupportedError(InvalidArgumentError, NotImplementedError):
    """A feature of Orbax's or DCP's API that mhckpt.orbax or mhckpt.torch
    does not provide; the message names it. Raised before anything is saved
    or read, never ignored."""


class NotFoundError(Error, LookupError):
    """No such step, or no such array in a step."""

    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    """The step is already committed."""

    code = "ALREADY_EXISTS"


class FailedPreconditionError(Error):
    """The call is not valid in this state (e.g. the manager is closed)."""

    code = "FAILED_PRECONDITION"


class DataLossError(Error):
    """A committed checkpoint is damaged or inconsistent."""

    code = "DATA_LOSS"


class IoError(Error, OSError):
    """The operating system or HDF5 failed a read or a write."""

    code = "IO_ERROR"


class InternalError(Error):
    """A bug in mhckpt."""

    code = "INTERNAL"


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        FailedPreconditionError,
        DataLossError,
        IoError,
        InternalError,
    )
}


def from_code(code: str, message: str) -> Error:
    """The exception for a C++ StatusCode name and message."""
    return _BY_CODE.get(code, InternalError)(message)


_core._set_error_factory(from_code)


def rank_error(e: BaseException, rank: int) -> Error:
    """This rank's error ``e`` as an mhckpt Error whose message names the rank."""
    if isinstance(e, Error):
        return type(e)(f"rank {rank}: {e.message}")
    if isinstance(e, (ValueError, TypeError, KeyError)):
        return InvalidArgumentError(f"rank {rank}: {e}")
    if isinstance(e, OSError):
        return IoError(f"rank {rank}: {type(e).__name__}: {e}")
    return from_code("INTERNAL", f"rank {rank}: {type(e).__name__}: {e}")
