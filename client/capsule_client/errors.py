"""The client's exceptions, one root (after httpx ``_exceptions.py``).

Tree::

    CapsuleError
    ├── DaemonNotRunning        nothing listens on the socket
    ├── ConnectionLost          the daemon closed the connection mid-request
    ├── RequestTimeout          no reply within the client's timeout
    ├── ProtocolError           a reply that is not JSON-RPC 2.0
    ├── ClientClosed            the client was used after close (also a RuntimeError)
    ├── SubscriptionDropped     the daemon ended a subscription that fell behind
    └── RemoteError             the daemon answered with an error (has ``code``)
        ├── InvalidRequest      -32600 / -32700
        ├── MethodNotFound      -32601
        ├── InvalidParams       -32602
        ├── InternalError       -32603
        ├── DiscoveryUnavailable -32001
        ├── Overloaded          -32002
        ├── NoSuchTrace         -32003
        ├── UnsafePath          -32004
        ├── ShuttingDown        -32005
        ├── PermissionDenied    -32006
        └── NoSuchSession       -32007

Wire codes map back to classes in exactly one place, :func:`error_from_wire`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from .wire.constants import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorCode,
)

__all__ = [
    "CapsuleError",
    "ClientClosed",
    "ConnectionLost",
    "DaemonNotRunning",
    "DiscoveryUnavailable",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "MethodNotFound",
    "NoSuchSession",
    "NoSuchTrace",
    "Overloaded",
    "PermissionDenied",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "ShuttingDown",
    "SubscriptionDropped",
    "UnsafePath",
    "error_from_wire",
]


class CapsuleError(Exception):
    """Root of every error the client raises."""


class DaemonNotRunning(CapsuleError):
    """Nothing accepts connections on the socket.

    Attributes:
        socket_path: the socket the client tried.
    """

    def __init__(self, socket_path: Path, reason: str = "") -> None:
        self.socket_path = socket_path
        self.reason = reason
        detail = f" ({reason})" if reason else ""
        super().__init__(
            f"capsuled is not running: nothing accepts connections on {socket_path}{detail}"
        )


class ConnectionLost(CapsuleError):
    """The daemon closed the connection before answering."""


class RequestTimeout(CapsuleError, TimeoutError):
    """No reply arrived within the timeout; the connection is closed."""


class ProtocolError(CapsuleError):
    """The daemon's reply is not the JSON-RPC 2.0 this client speaks."""


class ClientClosed(CapsuleError, RuntimeError):
    """The client was used after ``close()`` / ``aclose()``."""


class SubscriptionDropped(CapsuleError):
    """The daemon sent ``sessions.dropped``: the subscription fell too far behind
    (its notifications were not read) and has ended; subscribe again.

    Attributes:
        subscription: the subscription's id.
        reason: the daemon's reason.
    """

    def __init__(self, subscription: str, reason: str) -> None:
        self.subscription = subscription
        self.reason = reason
        super().__init__(f"subscription {subscription} dropped by the daemon: {reason}")


class RemoteError(CapsuleError):
    """The daemon answered with a JSON-RPC error.

    Attributes:
        code: the wire code (docs/design.md §7).
        message: the daemon's message.
        data: the error's ``data`` member, or ``None``.
    """

    code: ClassVar[int] = 0

    def __init__(self, message: str, data: Any = None, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
        if code is not None:
            self.code = code  # type: ignore[misc]


class InvalidRequest(RemoteError):
    code = INVALID_REQUEST


class MethodNotFound(RemoteError):
    code = METHOD_NOT_FOUND


class InvalidParams(RemoteError):
    code = INVALID_PARAMS


class InternalError(RemoteError):
    code = INTERNAL_ERROR


class DiscoveryUnavailable(RemoteError):
    code = ErrorCode.DISCOVERY_UNAVAILABLE


class Overloaded(RemoteError):
    code = ErrorCode.OVERLOADED


class NoSuchTrace(RemoteError):
    code = ErrorCode.NO_SUCH_TRACE


class UnsafePath(RemoteError):
    code = ErrorCode.UNSAFE_PATH


class ShuttingDown(RemoteError):
    code = ErrorCode.SHUTTING_DOWN


class PermissionDenied(RemoteError):
    code = ErrorCode.PERMISSION_DENIED


class NoSuchSession(RemoteError):
    """``session.terminate``: the session is not active in the daemon's fresh observation."""

    code = ErrorCode.NO_SUCH_SESSION


_BY_CODE: dict[int, type[RemoteError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        DiscoveryUnavailable,
        Overloaded,
        NoSuchTrace,
        UnsafePath,
        ShuttingDown,
        PermissionDenied,
        NoSuchSession,
    )
}
_BY_CODE[PARSE_ERROR] = InvalidRequest


def error_from_wire(code: int, message: str, data: Any = None) -> RemoteError:
    """The exception for a wire error; unknown codes give a plain :class:`RemoteError`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return RemoteError(message, data, code=code)
    return cls(message, data, code=code)
