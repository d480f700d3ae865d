"""Every type and constant that crosses the capsuled socket (docs/design.md §7).

The daemon and the clients share these ``msgspec.Struct`` definitions, so the
wire format is written down exactly once: the JSON-RPC envelope
(:mod:`.envelope`), each method's params (:mod:`.params`), the results and
notifications (:mod:`.results`), the daemon's status and metrics
(:mod:`.status`), and the codes, limits, defaults and the
version (:mod:`.constants`). Import them from here:

>>> from capsule_client.wire import ActiveSessionsSnapshot, ErrorCode

Conventions on the wire:

* times are Unix seconds (``observed_at``, ``started_at``) unless the name
  says ``_ms``;
* optional members are omitted when absent, never sent as ``null``, except
  where docs/design.md §7 gives ``null`` a meaning (``task``, ``context_id``);
* unknown members in params are refused (-32602), so a misspelt parameter is
  an error instead of being silently ignored; unknown members in results are
  ignored by the client (forward compatibility).

The Struct modules do not use ``from __future__ import annotations``: msgspec
then reads their annotations as the objects they are, instead of compiling each
one from its string when the first decoder of a type is made (every command and
the daemon make several).

What it may import: msgspec and the standard library, nothing else of the
package (the daemon imports it, docs/design.md §1). A name is imported from its
module when first asked for, so that reading a constant does not load msgspec.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from .constants import (
        DEFAULT_GRACE_MS,
        DEFAULT_SNAPSHOT_TIMEOUT_MS,
        DEFAULT_TIMEOUT_S,
        INTERNAL_ERROR,
        INVALID_PARAMS,
        INVALID_REQUEST,
        JSONRPC_VERSION,
        MAX_MESSAGE_BYTES,
        MAX_PARAM_MS,
        METHOD_NOT_FOUND,
        PARSE_ERROR,
        SESSIONS_CHANGED,
        SESSIONS_DROPPED,
        TRACE_LOCK_TIMEOUT_S,
        VERSION,
        ErrorCode,
    )
    from .envelope import (
        Envelope,
        ErrorObject,
        ErrorResponse,
        Notification,
        Request,
        Response,
        SuccessResponse,
    )
    from .params import (
        METHOD_PARAMS,
        NoParams,
        ReconcileParams,
        SnapshotParams,
        SpareProcess,
        SubscribeParams,
        SubscriptionId,
        TerminateParams,
        TerminateSignal,
        UnsubscribeParams,
    )
    from .results import (
        ActiveSessionsSnapshot,
        DiscoveryCost,
        DiscoveryState,
        ListeningSocket,
        LostReport,
        LostWork,
        PingResult,
        ProcessKind,
        Provenance,
        RescanResult,
        ServerEntry,
        Session,
        SessionProcess,
        SessionsChanged,
        SessionsDropped,
        SessionState,
        SessionUsage,
        SubscribeResult,
        TerminatedProcess,
        TerminateOutcome,
        TerminateReport,
        UnsubscribeResult,
    )
    from .status import (
        ExitWatchMode,
        MetricsResult,
        StatusResult,
        StatusTotals,
        VerificationStatus,
        WatcherMode,
        WatchStatus,
    )

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
    "METHOD_PARAMS",
    "PARSE_ERROR",
    "SESSIONS_CHANGED",
    "SESSIONS_DROPPED",
    "TRACE_LOCK_TIMEOUT_S",
    "VERSION",
    "ActiveSessionsSnapshot",
    "DiscoveryCost",
    "DiscoveryState",
    "Envelope",
    "ErrorCode",
    "ErrorObject",
    "ErrorResponse",
    "ExitWatchMode",
    "ListeningSocket",
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
    "SessionState",
    "SessionUsage",
    "SessionsChanged",
    "SessionsDropped",
    "SnapshotParams",
    "SpareProcess",
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


def __getattr__(name: str) -> object:
    """A name of ``__all__``, imported from the module that defines it on first use: the
    constants alone, the Structs (and msgspec) together."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import constants

    modules: tuple[ModuleType, ...] = (constants,)
    if name not in constants.__all__:
        from . import envelope, params, results, status

        modules = (envelope, params, results, status)
    for module in modules:
        if name in module.__all__:
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"{__name__}.__all__ names {name!r}, which no module defines")
