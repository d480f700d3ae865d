"""Errors a method handler raises to answer with a JSON-RPC error (docs/design.md §7).

The server turns an :class:`RpcError` into an error response with its
``code``, ``message`` and ``data``; any other exception escaping a handler
becomes -32603 and is logged with its traceback.

Tree::

    RpcError
    ├── InvalidParams          -32602
    ├── DiscoveryUnavailable   -32001
    ├── Overloaded             -32002
    ├── NoSuchTrace            -32003
    ├── UnsafePath             -32004
    ├── ShuttingDown           -32005
    ├── PermissionDenied       -32006
    ├── NoSuchSession          -32007
    │   └── SessionRunning     -32007 (``ended_only``: the session runs)
    └── InternalError          -32603 (an expected failure, logged without traceback)
"""

from __future__ import annotations

from typing import Any, ClassVar

from capsule_client.wire import INTERNAL_ERROR, INVALID_PARAMS, ErrorCode

__all__ = [
    "DiscoveryUnavailable",
    "InternalError",
    "InvalidParams",
    "NoSuchSession",
    "NoSuchTrace",
    "Overloaded",
    "PermissionDenied",
    "RpcError",
    "SessionRunning",
    "ShuttingDown",
    "UnsafePath",
]


class RpcError(Exception):
    """An error the client should see, with its wire code."""

    code: ClassVar[int] = INTERNAL_ERROR

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class InvalidParams(RpcError):
    """A parameter is missing, of the wrong type or out of range."""

    code = INVALID_PARAMS

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"invalid params: {param}: {reason}", {"param": param, "reason": reason})
        self.param = param
        self.reason = reason


class DiscoveryUnavailable(RpcError):
    code = ErrorCode.DISCOVERY_UNAVAILABLE


class Overloaded(RpcError):
    code = ErrorCode.OVERLOADED


class NoSuchTrace(RpcError):
    code = ErrorCode.NO_SUCH_TRACE


class UnsafePath(RpcError):
    code = ErrorCode.UNSAFE_PATH


class ShuttingDown(RpcError):
    code = ErrorCode.SHUTTING_DOWN


class PermissionDenied(RpcError):
    code = ErrorCode.PERMISSION_DENIED


class NoSuchSession(RpcError):
    """The session is not active in the (fresh) observation (``session.terminate``)."""

    code = ErrorCode.NO_SUCH_SESSION

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no such session: {session_id} is not active", {"session_id": session_id})
        self.session_id = session_id


class SessionRunning(NoSuchSession):
    """``session.terminate`` with ``ended_only``: the session is running, not ended
    (docs/design.md §13). Its ``data`` says so: ``{"session_id", "state": "running"}``."""

    def __init__(self, session_id: str) -> None:
        RpcError.__init__(
            self,
            f"no such ended session: {session_id} is running; nothing was signalled",
            {"session_id": session_id, "state": "running"},
        )
        self.session_id = session_id


class InternalError(RpcError):
    code = INTERNAL_ERROR
