"""The results and notifications of the capsuled socket (docs/design.md §7).

Unknown members in results are ignored by the client (forward compatibility).
"""

# Annotations are objects here, not strings: see the package's docstring.

from typing import Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "ActiveSessionsSnapshot",
    "DiscoveryCost",
    "DiscoveryState",
    "ExitWatchMode",
    "ListeningSocket",
    "LostReport",
    "LostWork",
    "MetricsResult",
    "PingResult",
    "ProcessKind",
    "Provenance",
    "RescanResult",
    "ServerEntry",
    "Session",
    "SessionProcess",
    "SessionState",
    "SessionUsage",
    "SessionsChanged",
    "SessionsDropped",
    "StatusResult",
    "StatusTotals",
    "SubscribeResult",
    "TerminateOutcome",
    "TerminateReport",
    "TerminatedProcess",
    "UnsubscribeResult",
    "VerificationStatus",
    "WatchStatus",
    "WatcherMode",
]


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
#: ``running`` while one of the session's own processes lives, ``ended`` when only
#: what it left behind (descendants) remains (docs/design.md §13).
SessionState = Literal["running", "ended"]


class DiscoveryCost(Struct):
    """What one observation cost (the original ``DiscoveryCost``, docs/design.md §5 step 5).

    Attributes:
        directories: directories listed.
        receipts: receipt files read (or stat-checked and found changed).
        bytes: receipt bytes read.
        process_samples: process samples taken (whole tables or partial).
        process_stats: processes whose ``/proc`` stat the samples read (a whole
            table reads every process's; a partial sample only the pids asked).
        rescans: full walks from scratch (0 or 1).
        retained: candidates kept after the observation.
        dirty_paths: changed paths pending at the start.
    """

    directories: int = 0
    receipts: int = 0
    bytes: int = 0
    process_samples: int = 0
    rescans: int = 0
    process_stats: int = 0
    retained: int = 0
    dirty_paths: int = 0


class ListeningSocket(Struct, gc=False, frozen=True):
    """A socket a process listens on, with ``ports: true`` (docs/design.md §13 "Ports").

    Attributes:
        proto: ``tcp`` (a socket in the ``LISTEN`` state) or ``udp`` (bound to
            a port and not connected: what ``ss -uln`` lists).
        address: the local address as ``ipaddress`` writes it: ``0.0.0.0``,
            ``127.0.0.1``, ``::``, ``::1``, ``::ffff:10.0.0.1``.
        port: the local port.
    """

    proto: Literal["tcp", "udp"]
    address: str
    port: int


class SessionProcess(Struct, omit_defaults=True, gc=False):
    """A live process and why it belongs where it is listed.

    Holds only strings, numbers and lists of strings (no cycle can run
    through it), so it is not tracked by the garbage
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
        receipt_command: what an exec receipt says its command is (docs/design.md
            §3): the runtime's claim, a string, shown as it was written.
        command: the process's argv as the OS says it (docs/design.md §5
            "What each process is"), only with ``commands: true``: a list of
            strings, at most 4 KiB in all, cut with a final ``"…"``; ``None``
            (JSON ``null``) where the OS does not say (a zombie, a process it
            hides). Bytes that are not UTF-8 are shown as ``\\xNN``.
        receipt: the receipt's path relative to the home, for receipts.
        parent_pid: a descendant's parent when it was first seen (it keeps
            this value after the parent exits).
        root_pid: the receipt's or owned process a descendant descends from.
        cpu_percent: CPU use since the daemon last measured this process
            (100 = one core; 0.0 the first time), only with ``usage: true``.
        rss_bytes: resident memory, bytes, only with ``usage: true``.
        ports: the process's listening sockets, only with ``ports: true``
            (docs/design.md §13 "Ports"): ``[]`` where it has none, ``None``
            (JSON ``null``) where the OS does not say (another user's process,
            whose descriptors it does not show).
    """

    kind: ProcessKind
    pid: int
    started_at: int
    input_id: str | UnsetType = UNSET
    exec_id: str | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    receipt_command: str | UnsetType = UNSET
    receipt: str | UnsetType = UNSET
    parent_pid: int | UnsetType = UNSET
    root_pid: int | UnsetType = UNSET
    command: list[str] | UnsetType | None = UNSET
    cpu_percent: float | UnsetType = UNSET
    rss_bytes: int | UnsetType = UNSET
    ports: list[ListeningSocket] | UnsetType | None = UNSET


class SessionUsage(Struct, gc=False):
    """What a session's processes use together, with ``usage: true`` (docs/design.md §13).

    Attributes:
        cpu_percent: the sum of its processes' ``cpu_percent`` (100 = one core).
        rss_bytes: the sum of its processes' ``rss_bytes``: a page two of them
            share is counted once for each (as ``ps`` and ``top`` add them up).
        processes: how many processes were measured (a process that exited
            before it was measured is listed without figures, and not counted).
    """

    cpu_percent: float
    rss_bytes: int
    processes: int


class Session(Struct):
    """An active session: it owns at least one live process (docs/design.md §5, §13).

    Attributes:
        session_id: the session's id.
        context_id: its context, ``None`` where the store names none.
        processes: its live processes, its descendants among them.
        state: ``running`` while one of its own processes lives (a receipt's
            process or an owned (pid, start) row: the agent, the launcher);
            ``ended`` when none does and only processes it left behind
            (descendants) remain.
        ended_at: only for an ``ended`` session: when the daemon saw its last
            own process go, Unix seconds; ``None`` (JSON ``null``) when the
            daemon did not see it go (it started, or started reading the home
            afresh, after that).
        usage: its processes' figures added up, only with ``usage: true``.

    ``state`` is always sent; ``ended_at`` and ``usage`` are left out where they
    do not apply (UNSET members are never encoded).
    """

    session_id: str
    context_id: str | None
    processes: list[SessionProcess]
    state: SessionState = "running"
    ended_at: float | UnsetType | None = UNSET
    usage: SessionUsage | UnsetType = UNSET


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
TerminateOutcome = Literal["exited", "killed", "gone", "refused", "spared"]


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
            daemon or its parent) or ``spared`` (the params' ``spare`` named
            it: nothing was sent).
        error: why, for ``refused``, and for a process still running after
            ``SIGKILL``.
        parent_pid: a descendant's parent, as in :class:`SessionProcess`.
        root_pid: the receipt's or owned process a descendant descends from.
        command: its argv as the OS said it, only with ``commands: true``
            (as in :class:`SessionProcess`).
    """

    pid: int
    started_at: int
    kind: ProcessKind
    outcome: TerminateOutcome
    error: str | UnsetType = UNSET
    parent_pid: int | UnsetType = UNSET
    root_pid: int | UnsetType = UNSET
    command: list[str] | UnsetType | None = UNSET


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
        lost_reports_trusted: of them, reports whose provenance is ``trusted``
            (these and the three below count a report once: a retry that gets
            the same report again does not count it again).
        lost_reports_untrusted: reports whose provenance is ``untrusted``.
        lost_works_trusted: lost works listed by the trusted reports.
        lost_works_untrusted: lost works listed by the untrusted reports.
        terminated_exited: processes ``session.terminate`` saw exit after its signal.
        terminated_killed: processes it killed after the grace period.
        terminated_gone: processes already gone when it came to them.
        terminated_refused: processes it may not signal.
        terminated_spared: processes it left alone because the caller spared them.
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
    terminated_spared: int = 0


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
        exit_watch: how process exits are noticed: ``pidfd`` (every watched
            process has a descriptor that wakes discovery when it exits) or
            ``sampling`` (the periodic sample notices some or all of them:
            ``sampled`` says how many).
        pidfds: exit descriptors held now.
        sampled: watched processes whose exit only the periodic sample
            notices (no pidfd on this system, past the pidfds' share, or the
            daemon out of descriptors); 0 from daemons before it was added.
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
    sampled: int = 0
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
