"""Every type that crosses the capsuled socket (docs/design.md §7).

The daemon and the clients share these ``msgspec.Struct`` definitions, so the
wire format is written down exactly once.  The JSON-RPC 2.0 envelope is
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

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

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
    """

    task: str | None = None
    timeout_ms: NonNegativeMs = 2000
    max_age_ms: NonNegativeMs | None = None
    since: Annotated[int, Meta(ge=0)] | None = None
    usage: bool = False


class SubscribeParams(Struct, forbid_unknown_fields=True):
    """Params of ``sessions.subscribe`` (docs/design.md §7).

    Attributes:
        since: a generation the caller already has. When it is the current
            one, the first notification is the next change; otherwise (and
            without it) the first notification is the full answer
            (``full: true``).
    """

    since: Annotated[int, Meta(ge=0)] | None = None


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
    """

    session_id: SessionName
    signal: TerminateSignal = "TERM"
    grace_ms: NonNegativeMs = 5000


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


# --------------------------------------------------------------------------
# Results


class PingResult(Struct):
    """Result of ``ping``."""

    pong: bool
    version: str


class RescanResult(Struct):
    """Result of ``reader.rescan``: the next observation walks from scratch."""

    scheduled: bool


DiscoveryState = Literal["ready", "scanning", "unavailable"]
WatcherMode = Literal["native", "polling", "off"]
ProcessKind = Literal["provider_client", "exec", "process", "descendant"]
ExitWatchMode = Literal["pidfd", "sampling"]


class DiscoveryCost(Struct):
    """What one observation cost (the original ``DiscoveryCost``, docs/design.md §5 step 5).

    Attributes:
        directories: directories listed.
        receipts: receipt files read (or stat-checked and found changed).
        bytes: receipt bytes read.
        process_samples: process tables sampled.
        rescans: full walks from scratch (0 or 1).
        retained: candidates kept after the observation.
        dirty_paths: changed paths pending at the start.
    """

    directories: int = 0
    receipts: int = 0
    bytes: int = 0
    process_samples: int = 0
    rescans: int = 0
    retained: int = 0
    dirty_paths: int = 0


class SessionProcess(Struct, omit_defaults=True, gc=False):
    """A live process and why it belongs where it is listed.

    Holds only strings and numbers, so it is not tracked by the garbage
    collector (``gc=False``): the daemon keeps one per live receipt.

    Attributes:
        kind: ``provider_client`` (from a provider-client receipt), ``exec``
            (from an exec receipt) or ``process`` (a sampled process whose
            (pid, start time) the store assigns to a session) or
            ``descendant`` (started by one of those, or in the Unix session
            one of them leads; docs/design.md §5).
        pid: the process id.
        started_at: the process's start time, Unix seconds, as the receipt
            or the store records it.
        receipt: the receipt's path relative to the home, for receipts.
        parent_pid: a descendant's parent when it was first seen (it keeps
            this value after the parent exits).
        root_pid: the receipt's or owned process a descendant descends from.
        cpu_percent: CPU use since the daemon last measured this process
            (100 = one core; 0.0 the first time), only with ``usage: true``.
        rss_bytes: resident memory, bytes, only with ``usage: true``.
    """

    kind: ProcessKind
    pid: int
    started_at: int
    input_id: str | UnsetType = UNSET
    exec_id: str | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    command: str | UnsetType = UNSET
    receipt: str | UnsetType = UNSET
    parent_pid: int | UnsetType = UNSET
    root_pid: int | UnsetType = UNSET
    cpu_percent: float | UnsetType = UNSET
    rss_bytes: int | UnsetType = UNSET


class Session(Struct):
    """An active session: it owns at least one live process (docs/design.md §5)."""

    session_id: str
    context_id: str | None
    processes: list[SessionProcess]


class ServerEntry(Struct, omit_defaults=True):
    """A live entry of the servers registry (docs/design.md §3)."""

    pid: int
    url: str | UnsetType = UNSET
    directory: str | UnsetType = UNSET
    started_at: int | UnsetType = UNSET


class ActiveSessionsSnapshot(Struct):
    """Result of ``sessions.snapshot`` (the original ActiveSessionReader, docs/design.md §7).

    ``sessions`` is empty unless ``discovery`` is ``ready``; ``gaps`` says in
    words what the answer could not cover (unreadable receipts, a missing
    store, an observation that has to be read again).
    """

    home: str
    observed_at: float
    generation: int
    task: str | None
    discovery: DiscoveryState
    sessions: list[Session]
    unowned: list[SessionProcess]
    servers: list[ServerEntry]
    gaps: list[str]
    cost: DiscoveryCost


class LostWork(Struct):
    """A background command that was detached and never accounted for."""

    work_id: str
    binary: str
    command: str
    detached_at_ms: int


class Provenance(Struct):
    """Where a report comes from and how far to trust it (the original reconcile_prior_session)."""

    origin: Literal["completion"]
    trust: Literal["trusted", "untrusted"]


class LostReport(Struct):
    """Result of ``session.reconcile`` when something was lost (docs/design.md §6)."""

    started_in_session: str
    lost: list[LostWork]
    context_id: str
    provenance: Provenance
    task_id: str
    message: str


#: What became of one process ``session.terminate`` signalled (docs/design.md §7).
TerminateOutcome = Literal["exited", "killed", "gone", "refused"]


class TerminatedProcess(Struct, omit_defaults=True):
    """One process of a ``session.terminate`` and what became of it.

    Attributes:
        pid: the process id.
        started_at: its start time, Unix seconds, as the observation listed it.
        kind: as in :class:`SessionProcess`.
        outcome: ``exited`` (it exited after the first signal, within the
            grace), ``killed`` (``SIGKILL`` ended it: after the grace, or it
            was the signal asked for), ``gone`` (it had exited, or its pid
            was reused, before it could be signalled: nothing was sent) or
            ``refused`` (it may not be signalled: ``EPERM``, or pid 1, the
            daemon or its parent).
        error: why, for ``refused``, and for a process still running after
            ``SIGKILL``.
    """

    pid: int
    started_at: int
    kind: ProcessKind
    outcome: TerminateOutcome
    error: str | UnsetType = UNSET


class TerminateReport(Struct):
    """Result of ``session.terminate`` (docs/design.md §7).

    Attributes:
        session_id: the session, as asked.
        processes: every process signalled or found, sorted by pid,
            descendants that appeared during the grace included.
        duration_ms: from the first signal to the last exit (or the end of
            the wait after ``SIGKILL``), milliseconds.
    """

    session_id: str
    processes: list[TerminatedProcess]
    duration_ms: int


class StatusTotals(Struct):
    """Counters since the daemon started.

    Attributes:
        reconciles: ``session.reconcile`` calls that finished (lost work or not).
        lost_reports_trusted: of them, reports whose provenance is ``trusted``.
        lost_reports_untrusted: reports whose provenance is ``untrusted``.
        lost_works_trusted: lost works listed by the trusted reports.
        lost_works_untrusted: lost works listed by the untrusted reports.
        terminated_exited: processes ``session.terminate`` saw exit after its signal.
        terminated_killed: processes it killed after the grace period.
        terminated_gone: processes already gone when it came to them.
        terminated_refused: processes it may not signal.
    """

    observations: int = 0
    rescans: int = 0
    readers_restarted: int = 0
    requests: int = 0
    errors: int = 0
    subscriptions_dropped: int = 0
    verifications: int = 0
    verification_changes: int = 0
    reconciles: int = 0
    lost_reports_trusted: int = 0
    lost_reports_untrusted: int = 0
    lost_works_trusted: int = 0
    lost_works_untrusted: int = 0
    terminated_exited: int = 0
    terminated_killed: int = 0
    terminated_gone: int = 0
    terminated_refused: int = 0


class WatchStatus(Struct):
    """What the watch does now (``status.watch``).

    Attributes:
        mode: ``native``, ``polling`` or ``off``.
        backend: ``inotify`` (Linux), ``watchfiles`` (elsewhere), ``lstat``
            (the daemon's own poller) or ``none`` (nothing runs).
        watched_directories: directories with a native watch now.
        polled_directories: directories polled now: all of them while
            polling, the ones a native watch could not watch otherwise.
        overflows: kernel queue overflows since start (each owed a walk).
        starts: watches started since start (each restart adds one).
    """

    mode: WatcherMode
    backend: str
    watched_directories: int = 0
    polled_directories: int = 0
    overflows: int = 0
    starts: int = 0


class VerificationStatus(Struct):
    """The net under the watch (``status.verification``).

    Attributes:
        interval_s: seconds between two verification runs (``--verify-interval``);
            None when there are none (no watch: every observation walks).
        runs: verification runs since start.
        changes_found: changes the watch had not reported, found by them, in total.
        last_at: when the last run finished, Unix seconds; None before the first.
        last_changes: changes the last run found.
        last_checked: directories and candidates the last run compared.
    """

    interval_s: float | None
    runs: int = 0
    changes_found: int = 0
    last_at: float | None = None
    last_changes: int = 0
    last_checked: int = 0


class StatusResult(Struct):
    """Result of ``status`` (docs/design.md §7).

    Attributes:
        pid: the daemon's process id.
        version: the daemon's version.
        home: the home it reads, absolute.
        socket: the socket it serves.
        started_at: when it started, Unix seconds.
        uptime_s: seconds since then.
        watcher: ``native``, ``polling`` or ``off`` (no watcher running).
        discovery: the last observation's state, ``None`` before the first.
        last_observed_at: when the last observation finished, Unix seconds.
        last_cost: the last observation's cost.
        totals: counters since start.
        clients: connections open now.
        notes: plain-language remarks (e.g. why there is no observation yet).
        subscriptions: ``sessions.subscribe`` subscriptions open now.
        exit_watch: how process exits are noticed: ``pidfd`` (each watched
            process has a descriptor that wakes discovery when it exits) or
            ``sampling`` (only the periodic sample notices).
        pidfds: exit descriptors held now.
        long_polls: ``sessions.snapshot`` requests with ``since`` waiting
            for a change now.
        watch: the watch's backend, watched and polled directories, overflows.
        verification: the verification runs and what they found.
    """

    pid: int
    version: str
    home: str
    socket: str
    started_at: float
    uptime_s: float
    watcher: WatcherMode
    discovery: DiscoveryState | None
    last_observed_at: float | None
    last_cost: DiscoveryCost | None
    totals: StatusTotals
    clients: int
    notes: list[str] = msgspec.field(default_factory=list)
    subscriptions: int = 0
    exit_watch: ExitWatchMode = "sampling"
    pidfds: int = 0
    long_polls: int = 0
    watch: WatchStatus | None = None
    verification: VerificationStatus | None = None


class MetricsResult(Struct):
    """Result of ``metrics``: the OpenMetrics text exposition of the daemon's figures
    (docs/design.md §7), ending ``# EOF``."""

    text: str


class SubscribeResult(Struct):
    """Result of ``sessions.subscribe``: the id that notifications carry."""

    subscription: str


class UnsubscribeResult(Struct):
    """Result of ``sessions.unsubscribe``: False if there was no such subscription
    (already dropped, ended, or another connection's)."""

    unsubscribed: bool


class SessionsChanged(Struct, omit_defaults=True):
    """Params of a ``sessions.changed`` notification (docs/design.md §7).

    Sent first with the full answer (``full: true``; every session in
    ``added``), then after each change of the answer, at most one per
    settle interval (20 ms) per subscription; changes in between are
    coalesced into the next one.

    Attributes:
        subscription: the id ``sessions.subscribe`` returned.
        generation: the answer's generation (docs/design.md §7).
        observed_at: when the answer was observed, Unix seconds.
        full: True for the first notification, whose ``added`` is every
            session (the client starts from nothing).
        discovery: ``ready`` or ``unavailable`` (``scanning`` answers are
            transient and never sent).
        added: sessions that became active, whole.
        changed: sessions whose processes or context changed, whole.
        removed: ids of sessions no longer active.
        unowned: every live receipt nobody owns, whole (not a difference).
        servers: every live server, whole.
        gaps: what the answer could not cover, whole.
    """

    subscription: str
    generation: int
    observed_at: float
    discovery: DiscoveryState
    added: list[Session]
    changed: list[Session]
    removed: list[str]
    unowned: list[SessionProcess]
    servers: list[ServerEntry]
    gaps: list[str]
    full: bool = False


class SessionsDropped(Struct):
    """Params of a ``sessions.dropped`` notification: the subscription fell too
    far behind (or the daemon is stopping) and has ended; subscribe again."""

    subscription: str
    reason: str


class Notification(Struct):
    """A notification the daemon sends: no ``id``, never answered."""

    jsonrpc: str
    method: str
    params: Any
