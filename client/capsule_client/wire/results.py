"""The results and notifications of the capsuled socket (docs/design.md §7).

Unknown members in results are ignored by the client (forward compatibility).
"""

# Annotations are objects here, not strings: see the package's docstring.

from typing import Literal

from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "ActiveSessionsSnapshot",
    "DiscoveryCost",
    "DiscoveryState",
    "ListeningSocket",
    "LostReport",
    "LostWork",
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
    "SubscribeResult",
    "TerminateOutcome",
    "TerminateReport",
    "TerminatedProcess",
    "UnsubscribeResult",
]


class PingResult(Struct):
    """Result of ``ping``."""

    pong: bool
    version: str


class RescanResult(Struct):
    """Result of ``reader.rescan``: the next observation walks from scratch."""

    scheduled: bool


DiscoveryState = Literal["ready", "scanning", "unavailable"]
ProcessKind = Literal["provider_client", "exec", "process", "descendant"]
#: ``running`` while one of the session's own processes lives, ``ended`` when only
#: what it left behind (descendants) remains (docs/design.md §13).
SessionState = Literal["running", "ended"]


class DiscoveryCost(Struct):
    """What one observation cost (docs/design.md §5 step 5).

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
    """Result of ``sessions.snapshot`` (docs/design.md §7).

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
    """Where a report comes from and how far to trust it (docs/design.md §6)."""

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
