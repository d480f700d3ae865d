"""Every type and constant that crosses the capsuled socket (docs/design.md §7).

The daemon and the clients share these ``msgspec.Struct`` definitions, so the
wire format is written down exactly once: the JSON-RPC envelope
(:mod:`.envelope`), each method's params (:mod:`.params`), the results and
notifications (:mod:`.results`), and the codes, limits, defaults and the
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

What it may import: msgspec and the standard library, nothing else of the
package (the daemon imports it, docs/design.md §1). A name is imported from its
module when first asked for, so that reading a constant does not load msgspec.
"""

from __future__ import annotations

import importlib as _importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
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
        ExitWatchMode,
        LostReport,
        LostWork,
        MetricsResult,
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
    "VERSION",
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

#: The modules that define the names above, the one without imports first.
_MODULES = ("constants", "envelope", "params", "results")


def __getattr__(name: str) -> object:
    """A name of ``__all__``, imported from the module that defines it on first use."""
    if name in __all__:
        for module_name in _MODULES:
            module = _importlib.import_module(f"{__name__}.{module_name}")
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
