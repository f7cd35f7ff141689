"""Exceptions raised for the status codes of libpsclient (gRPC's canonical codes).

Every failed call raises a subclass of :class:`PsError`; ``.status`` is the code's name
(``"NOT_FOUND"``), ``.code`` its number and ``.message`` the library's message (the server's,
when a server replied with an error)."""

from __future__ import annotations

from typing import Dict, Type

STATUS_NAMES: Dict[int, str] = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}


class PsError(Exception):
    """A libpsclient call failed.

    Attributes:
        code: the numeric status (gRPC's numbering).
        status: the status name, e.g. ``"NOT_FOUND"``.
        message: what went wrong, as the library or the server said it.
    """

    code: int = 2

    def __init__(self, message: str, code: int | None = None) -> None:
        if code is not None:
            self.code = code
        self.status = STATUS_NAMES.get(self.code, f"STATUS_{self.code}")
        self.message = message
        super().__init__(f"{self.status}: {message}" if message else self.status)


class CancelledError(PsError):
    code = 1


class UnknownError(PsError):
    code = 2


class InvalidArgumentError(PsError):
    code = 3


class DeadlineExceededError(PsError):
    code = 4


class NotFoundError(PsError):
    code = 5


class AlreadyExistsError(PsError):
    code = 6


class PermissionDeniedError(PsError):
    code = 7


class ResourceExhaustedError(PsError):
    code = 8


class FailedPreconditionError(PsError):
    code = 9


class AbortedError(PsError):
    code = 10


class OutOfRangeError(PsError):
    code = 11


class UnimplementedError(PsError):
    code = 12


class InternalError(PsError):
    code = 13


class UnavailableError(PsError):
    code = 14


class DataLossError(PsError):
    code = 15


class UnauthenticatedError(PsError):
    code = 16


_BY_CODE: Dict[int, Type[PsError]] = {
    cls.code: cls
    for cls in (CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
                NotFoundError, AlreadyExistsError, PermissionDeniedError,
                ResourceExhaustedError, FailedPreconditionError, AbortedError, OutOfRangeError,
                UnimplementedError, InternalError, UnavailableError, DataLossError,
                UnauthenticatedError)
}


def error_for(code: int, message: str) -> PsError:
    """The exception for status `code` with `message` (PsError itself for unknown codes)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return PsError(message, code)
    return cls(message)
