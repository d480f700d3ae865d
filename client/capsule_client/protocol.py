"""Every type that crosses the capsuled socket (docs/design.md §7).

The daemon and the clients share these ``msgspec.Struct`` definitions, so the
wire format is written down exactly once: the envelope and the params here,
the results and notifications in :mod:`capsule_client._results`, re-exported
here.  The JSON-RPC 2.0 envelope is
decoded in two steps, as in msgspec's ``asyncio-kv`` example: first
:class:`Envelope`, whose members are all :class:`msgspec.Raw` so that a wrong
member type can still be answered with the request's ``id``, then the
``params`` with one typed decoder per method (``METHOD_PARAMS``).

Conventions on the wire:

* times are Unix seconds (``observed_at``, ``started_at``) unless the name
  says ``_ms``;
* optional members are omitted when absent, never sent as ``null``, except
  where docs/design.md §7 gives ``null`` a meaning (``task``, ``context_id``);
* unknown members in params are refused (-32602), so a misspelt parameter is
  an error instead of being silently ignored; unknown members in results are
  ignored by the client (forward compatibility).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from ._results import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    DiscoveryState,
    ExitWatchMode,
    LostReport,
    LostWork,
    MetricsResult,
    Notification,
    PingResult,
    ProcessKind,
    Provenance,
    RescanResult,
    ServerEntry,
    Session,
    SessionProcess,
    SessionsChanged,
    SessionsDropped,
    StatusResult,
    StatusTotals,
    SubscribeResult,
    TerminatedProcess,
    TerminateOutcome,
    TerminateReport,
    UnsubscribeResult,
    VerificationStatus,
    WatcherMode,
    WatchStatus,
)

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "JSONRPC_VERSION",
    "MAX_MESSAGE_BYTES",
    "METHOD_NOT_FOUND",
    "METHOD_PARAMS",
    "PARSE_ERROR",
    "SESSIONS_CHANGED",
    "SESSIONS_DROPPED",
    "ActiveSessionsSnapshot",
    "DiscoveryCost",
    "DiscoveryState",
    "Envelope",
    "ErrorCode",
    "ErrorObject",
    "ErrorResponse",
    "ExitWatchMode",
    "LostReport",
    "LostWork",
    "MetricsResult",
    "NoParams",
    "Notification",
    "PingResult",
    "ProcessKind",
    "Provenance",
    "ReconcileParams",
    "Request",
    "RescanResult",
    "Response",
    "ServerEntry",
    "Session",
    "SessionProcess",
    "SessionsChanged",
    "SessionsDropped",
    "SnapshotParams",
    "StatusResult",
    "StatusTotals",
    "SubscribeParams",
    "SubscribeResult",
    "SubscriptionId",
    "SuccessResponse",
    "TerminateOutcome",
    "TerminateParams",
    "TerminateReport",
    "TerminateSignal",
    "TerminatedProcess",
    "UnsubscribeParams",
    "UnsubscribeResult",
    "VerificationStatus",
    "WatchStatus",
    "WatcherMode",
]

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


# --------------------------------------------------------------------------
# Envelope


class Envelope(Struct):
    """A JSON-RPC request or notification, members left undecoded.

    ``id`` is UNSET for a notification (no ``id`` member) and the raw bytes
    ``null`` for a request whose id is null: the two are answered differently.
    """

    jsonrpc: Raw | UnsetType = UNSET
    method: Raw | UnsetType = UNSET
    params: Raw | UnsetType = UNSET
    id: Raw | UnsetType = UNSET


class Request(Struct, omit_defaults=True):
    """What a client sends; ``params`` is omitted when there are none."""

    jsonrpc: str
    method: str
    id: int | str | None
    params: Any | UnsetType = UNSET


class ErrorObject(Struct, omit_defaults=True):
    """The ``error`` member of a response."""

    code: int
    message: str
    data: Any | UnsetType = UNSET


class SuccessResponse(Struct):
    """``{"jsonrpc": "2.0", "id": ..., "result": ...}``; ``result`` may be null."""

    jsonrpc: str
    id: Raw | None
    result: Any


class ErrorResponse(Struct):
    """``{"jsonrpc": "2.0", "id": ..., "error": {...}}``; ``id`` is null when unknown."""

    jsonrpc: str
    id: Raw | None
    error: ErrorObject


class Response(Struct):
    """What a client decodes: a reply (``result`` or ``error``) or a notification (``method``)."""

    id: int | str | float | None = None
    result: Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET


# --------------------------------------------------------------------------
# Params


class NoParams(Struct, forbid_unknown_fields=True):
    """Params of a method that takes none: absent, ``{}`` or ``[]``."""


NonNegativeMs = Annotated[int, Meta(ge=0, le=3_600_000)]


class SnapshotParams(Struct, forbid_unknown_fields=True):
    """Params of ``sessions.snapshot`` (docs/design.md §7).

    Attributes:
        task: echoed back in the snapshot, for the caller's bookkeeping.
        timeout_ms: how long the daemon may take to answer: wait for an
            observation, retry a ``scanning`` one, or wait for a change with
            ``since``. An observation still running then goes on; the answer
            is the latest observation's (-32001 if ``max_age_ms`` was given
            and the latest is older than that).
        max_age_ms: answer from the latest observation if it is younger than
            this, else from one that began at most this long before the
            request arrived; ``0`` forces a new observation.  Default: the
            sample interval.
        since: a generation the caller already has; answer at once if the
            current one differs, else wait up to ``timeout_ms`` (long poll).
        usage: add each listed process's ``cpu_percent`` and ``rss_bytes``,
            measured by the daemon when it answers (``capsulectl top``).
        commands: add each listed process's ``command``, its argv as the OS
            says it (docs/design.md §5 "What each process is").
    """

    task: str | None = None
    timeout_ms: NonNegativeMs = 2000
    max_age_ms: NonNegativeMs | None = None
    since: Annotated[int, Meta(ge=0)] | None = None
    usage: bool = False
    commands: bool = False


class SubscribeParams(Struct, forbid_unknown_fields=True):
    """Params of ``sessions.subscribe`` (docs/design.md §7).

    Attributes:
        since: a generation the caller already has. When it is the current
            one, the first notification is the next change; otherwise (and
            without it) the first notification is the full answer
            (``full: true``).
        commands: every process the notifications list carries its
            ``command`` (docs/design.md §5 "What each process is").
    """

    since: Annotated[int, Meta(ge=0)] | None = None
    commands: bool = False


SubscriptionId = Annotated[str, Meta(min_length=1, max_length=128)]


class UnsubscribeParams(Struct, forbid_unknown_fields=True):
    """Params of ``sessions.unsubscribe``: a subscription of this connection."""

    subscription: SubscriptionId


SessionName = Annotated[str, Meta(min_length=1, max_length=4096)]


class ReconcileParams(Struct, forbid_unknown_fields=True):
    """Params of ``session.reconcile`` (docs/design.md §6, §7)."""

    from_session: SessionName
    this_session: SessionName
    context_id: Annotated[str, Meta(max_length=4096)]


#: The signals ``session.terminate`` may send first (docs/design.md §7).
TerminateSignal = Literal["TERM", "INT", "HUP", "KILL"]


class TerminateParams(Struct, forbid_unknown_fields=True):
    """Params of ``session.terminate`` (docs/design.md §7).

    Attributes:
        session_id: a session active in a fresh observation (else -32007).
        signal: sent first to every live process of the session.
        grace_ms: how long the processes have to exit before ``SIGKILL``
            (none is sent when ``signal`` is ``KILL``).
        commands: every process of the report carries its ``command``, as
            read before the first signal (docs/design.md §5 "What each process is").
    """

    session_id: SessionName
    signal: TerminateSignal = "TERM"
    grace_ms: NonNegativeMs = 5000
    commands: bool = False


#: Params type of each method; a method not listed here does not exist.
METHOD_PARAMS: Final[dict[str, type[Struct]]] = {
    "ping": NoParams,
    "status": NoParams,
    "sessions.snapshot": SnapshotParams,
    "session.reconcile": ReconcileParams,
    "reader.rescan": NoParams,
    "sessions.subscribe": SubscribeParams,
    "sessions.unsubscribe": UnsubscribeParams,
    "metrics": NoParams,
    "session.terminate": TerminateParams,
}

#: Notification methods the daemon sends (subscriptions, docs/design.md §7).
SESSIONS_CHANGED: Final = "sessions.changed"
SESSIONS_DROPPED: Final = "sessions.dropped"
