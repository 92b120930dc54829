"""kvfabric's errors: one exception class per status code.

Every failing call raises a subclass of :class:`Error` whose ``code`` is the
status code (numbered as gRPC's and ``kvfabric::StatusCode``, never
renumbered) and whose message names what was wrong, with its numbers and the
setting to change, e.g.::

    kvfabric.ResourceExhausted: [8] new_context: the history pool has 12 free
    pages of 256; a context of 4096 tokens needs 256 ... (history_pool_bytes)
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class Error(Exception):
    """A kvfabric call failed. ``code``: the status code (int); ``code_name``:
    its name ("Unavailable"); ``message``: what was wrong. ``report`` is set
    on errors from ``finish`` (the context's report, filled in whatever
    happened)."""

    code: int = 2
    code_name: str = "Unknown"
    report: Optional[object] = None

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.code_name = _NAMES.get(code, "Unknown")
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class Cancelled(Error):
    """The operation was cancelled (code 1)."""


class Unknown(Error):
    """An error of no other kind (code 2)."""


class InvalidArgument(Error):
    """An argument or option was wrong; the message names it (code 3)."""


class DeadlineExceeded(Error):
    """A wait or a call ran past its deadline (code 4)."""


class NotFound(Error):
    """A block, context or peer does not exist (code 5)."""


class AlreadyExists(Error):
    """Code 6."""


class PermissionDenied(Error):
    """The daemon or placement refused this tenant or identity (code 7)."""


class ResourceExhausted(Error):
    """A bounded resource is full (history pool, arena); the message gives
    the arithmetic and the setting (code 8)."""


class FailedPrecondition(Error):
    """The call does not fit the object's state (code 9)."""


class Aborted(Error):
    """Code 10; also a recompute callable that raised something else."""


class OutOfRange(Error):
    """An index past its range (code 11)."""


class Unimplemented(Error):
    """Not supported by this build or peer (code 12)."""


class Internal(Error):
    """A bug or broken invariant inside kvfabric (code 13)."""


class Unavailable(Error):
    """Placement or a daemon did not answer (code 14)."""


class DataLoss(Error):
    """Stored bytes failed their check (code 15)."""


_CLASSES: Dict[int, Type[Error]] = {
    1: Cancelled,
    2: Unknown,
    3: InvalidArgument,
    4: DeadlineExceeded,
    5: NotFound,
    6: AlreadyExists,
    7: PermissionDenied,
    8: ResourceExhausted,
    9: FailedPrecondition,
    10: Aborted,
    11: OutOfRange,
    12: Unimplemented,
    13: Internal,
    14: Unavailable,
    15: DataLoss,
}
_NAMES: Dict[int, str] = {code: cls.__name__ for code, cls in _CLASSES.items()}


def error_class(code: int) -> Type[Error]:
    """The class raised for status ``code`` (:class:`Unknown` for a code not
    listed)."""
    return _CLASSES.get(code, Unknown)


__all__ = ["Error", "error_class"] + [cls.__name__ for cls in _CLASSES.values()]
