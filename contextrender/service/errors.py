"""What can go wrong in a session operation, as a kind of error rather than an HTTP status.

:class:`~contextrender.service.sessions.ContextService` raises these; each front end maps
:attr:`ServiceError.kind` to its own answer (the session API to a status and ``{"detail"}``
body in :mod:`contextrender.service.server`, the proxy to an OpenAI error, the wrapper to
Python exceptions), so the library carries no transport detail.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar


class ErrorKind(Enum):
    """Why an operation was refused."""

    #: A parameter outside its domain: method, overrides, budget, session id, encoding.
    BAD_REQUEST = "bad_request"
    #: The messages are not valid OpenAI chat messages; none of the batch was stored.
    INVALID_MESSAGES = "invalid_messages"
    #: The session does not exist.
    NOT_FOUND = "not_found"
    #: The request contradicts what is stored (an edited past, another writer).
    CONFLICT = "conflict"
    #: A bug on this side (a policy broke its own contract), never the caller's fault.
    INTERNAL = "internal"
    #: The answer would exceed a limit (a view's page); the message names it and how to ask for less.
    TOO_LARGE = "too_large"
    #: The graph file could not be written (a full disk, a read-only or failing file); nothing of the
    #: refused operation was stored, and everything acknowledged before it is still there.
    STORAGE = "storage"


class ServiceError(Exception):
    """A refused session operation, with a message meant for the caller."""

    kind: ClassVar[ErrorKind] = ErrorKind.BAD_REQUEST

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ServiceError):
    """A parameter outside its domain (method, overrides, budget, session id)."""

    kind = ErrorKind.BAD_REQUEST


class InvalidMessages(ServiceError):
    """The messages are not valid OpenAI chat messages; none of the batch is stored."""

    kind = ErrorKind.INVALID_MESSAGES


class NotFound(ServiceError):
    """No session by that id."""

    kind = ErrorKind.NOT_FOUND


class Conflict(ServiceError):
    """The request contradicts the stored, append-only history (or the graph refused the write)."""

    kind = ErrorKind.CONFLICT


class InternalError(ServiceError):
    """A policy broke its contract (a render over budget, or without sources)."""

    kind = ErrorKind.INTERNAL


class TooLarge(ServiceError):
    """The answer would exceed a limit; the message names the limit and how to narrow the request."""

    kind = ErrorKind.TOO_LARGE


class StorageError(ServiceError):
    """The graph file refused a write (disk full, read-only, I/O error); the operation stored nothing."""

    kind = ErrorKind.STORAGE


__all__ = ["BadRequest", "Conflict", "ErrorKind", "InternalError", "InvalidMessages", "NotFound", "ServiceError",
           "StorageError", "TooLarge"]
