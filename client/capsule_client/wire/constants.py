"""The protocol's constants (docs/design.md §7): the version, the error codes, the
method names of the notifications, the limits and the defaults, each written once.

This module imports nothing: ``capsulectl --version`` and the exceptions read it
without loading msgspec.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

__all__ = [
    "DEFAULT_GRACE_MS",
    "DEFAULT_SNAPSHOT_TIMEOUT_MS",
    "DEFAULT_TIMEOUT_S",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "JSONRPC_VERSION",
    "MAX_MESSAGE_BYTES",
    "MAX_PARAM_MS",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SESSIONS_CHANGED",
    "SESSIONS_DROPPED",
    "TRACE_LOCK_TIMEOUT_S",
    "VERSION",
    "ErrorCode",
]

#: The version of the distribution, daemon and client alike (they ship together):
#: pyproject.toml reads it at build time, the daemon answers it in ``ping`` and
#: ``status``, ``capsulectl --version`` prints it.
VERSION: Final = "0.1.0"

JSONRPC_VERSION: Final = "2.0"

#: A message (one line, without its ``\n``) longer than this gets -32600 and
#: the connection is closed (docs/design.md §7).
MAX_MESSAGE_BYTES: Final = 1024 * 1024

# JSON-RPC 2.0 codes (https://www.jsonrpc.org/specification#error_object).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603


class ErrorCode:
    """capsuled's own error codes (docs/design.md §7), beside the JSON-RPC ones."""

    DISCOVERY_UNAVAILABLE: Final = -32001
    OVERLOADED: Final = -32002
    NO_SUCH_TRACE: Final = -32003
    UNSAFE_PATH: Final = -32004
    SHUTTING_DOWN: Final = -32005
    PERMISSION_DENIED: Final = -32006
    NO_SUCH_SESSION: Final = -32007


#: Notification methods the daemon sends (subscriptions, docs/design.md §7).
SESSIONS_CHANGED: Final = "sessions.changed"
SESSIONS_DROPPED: Final = "sessions.dropped"

#: The longest wait a millisecond param may ask (``timeout_ms``, ``max_age_ms``,
#: ``grace_ms``): an hour.
MAX_PARAM_MS: Final = 3_600_000

#: ``session.terminate``'s ``grace_ms`` when the params do not give one; ``capsulectl
#: terminate --grace``, ``capsulectl run --terminate-on-exit`` and the MCP tool
#: ``terminate_session`` default to it too.
DEFAULT_GRACE_MS: Final = 5000

#: ``sessions.snapshot``'s ``timeout_ms`` when the params do not give one.
DEFAULT_SNAPSHOT_TIMEOUT_MS: Final = 2000

#: Seconds a trace's writer, and ``session.reconcile`` in the daemon, wait for another
#: holder of the trace's lock (docs/design.md §6): a client waits for a reconcile at
#: least this long before the daemon's scan even starts.
TRACE_LOCK_TIMEOUT_S: Final = 10.0

#: Seconds a client waits for a reply unless told otherwise (docs/design.md §9).
DEFAULT_TIMEOUT_S: Final = 5.0
