"""The params of each method of the capsuled socket (docs/design.md §7).

Unknown members are refused (-32602), so a misspelt parameter is an error
instead of being silently ignored. :data:`METHOD_PARAMS` is the list of
methods: one not in it does not exist.
"""

# Annotations are objects here, not strings: see the package's docstring.

from typing import Annotated, Final, Literal

from msgspec import Meta, Struct, field

from .constants import DEFAULT_GRACE_MS, DEFAULT_SNAPSHOT_TIMEOUT_MS, MAX_PARAM_MS

__all__ = [
    "METHOD_PARAMS",
    "NoParams",
    "ReconcileParams",
    "SnapshotParams",
    "SpareProcess",
    "SubscribeParams",
    "SubscriptionId",
    "TerminateParams",
    "TerminateSignal",
    "UnsubscribeParams",
]


class NoParams(Struct, forbid_unknown_fields=True):
    """Params of a method that takes none: absent, ``{}`` or ``[]``."""


NonNegativeMs = Annotated[int, Meta(ge=0, le=MAX_PARAM_MS)]


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
            and each session's totals (``usage``), measured by the daemon when
            it answers (``capsulectl top``, docs/design.md §13).
        commands: add each listed process's ``command``, its argv as the OS
            says it (docs/design.md §5 "What each process is").
        ports: add each listed process's ``ports``, the sockets it listens
            on (docs/design.md §13 "Ports").
    """

    task: str | None = None
    timeout_ms: NonNegativeMs = DEFAULT_SNAPSHOT_TIMEOUT_MS
    max_age_ms: NonNegativeMs | None = None
    since: Annotated[int, Meta(ge=0)] | None = None
    usage: bool = False
    commands: bool = False
    ports: bool = False


class SubscribeParams(Struct, forbid_unknown_fields=True):
    """Params of ``sessions.subscribe`` (docs/design.md §7).

    Attributes:
        since: a generation the caller already has. When it is the current
            one, the first notification is the next change; otherwise (and
            without it) the first notification is the full answer
            (``full: true``).
        commands: every process the notifications list carries its
            ``command`` (docs/design.md §5 "What each process is").
        ports: every process the notifications list carries its ``ports``
            (docs/design.md §13 "Ports").
    """

    since: Annotated[int, Meta(ge=0)] | None = None
    commands: bool = False
    ports: bool = False


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


#: The most processes one ``session.terminate`` may spare.
MAX_SPARED: Final = 1024


class SpareProcess(Struct, forbid_unknown_fields=True):
    """A process ``session.terminate`` must not signal (docs/design.md §7, §11).

    Attributes:
        pid: its pid.
        started_at: its start time, Unix seconds: as the session's listing
            gives it, or as the OS says (it matches within a second).
    """

    pid: Annotated[int, Meta(gt=0)]
    started_at: int


class TerminateParams(Struct, forbid_unknown_fields=True):
    """Params of ``session.terminate`` (docs/design.md §7).

    Attributes:
        session_id: a session active in a fresh observation (else -32007).
        signal: sent first to every live process of the session.
        grace_ms: how long the processes have to exit before ``SIGKILL``
            (none is sent when ``signal`` is ``KILL``).
        commands: every process of the report carries its ``command``, as
            read before the first signal (docs/design.md §5 "What each process is").
        spare: processes of the session that are not signalled: each is
            reported with the outcome ``spared`` (an agent stopping what it
            left running, not itself: docs/design.md §11). One that is not
            among the session's processes changes nothing.
        ended_only: only if the session is ``ended`` in the fresh observation
            (docs/design.md §13): a running session is not touched (-32007,
            ``data.state`` ``running``), and processes that appear during the
            grace are signalled only while it stays ended.
    """

    session_id: SessionName
    signal: TerminateSignal = "TERM"
    grace_ms: NonNegativeMs = DEFAULT_GRACE_MS
    commands: bool = False
    spare: Annotated[list[SpareProcess], Meta(max_length=MAX_SPARED)] = field(default_factory=list)
    ended_only: bool = False


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
