"""What the ``capsulectl mcp`` tools answer: the output models and the text for a model.

Each tool's result is one of the models here, sent as the structured content
(its JSON schema is the tool's output schema), and a short text made from
the same values: what runs, for how long, and what the user can do
(docs/design.md §11). Built from the daemon's wire types
(:mod:`capsule_client.wire`); imported only by :mod:`.server`, since it needs
pydantic, which comes with the MCP SDK.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar, Final

from msgspec import UNSET, UnsetType
from pydantic import BaseModel, Field

from ..text import command_line, counted, duration, inert, one_line, unsettled
from ..wire import (
    ActiveSessionsSnapshot,
    ListeningSocket,
    ProcessKind,
    Session,
    SessionProcess,
    SessionState,
    TerminateOutcome,
    TerminateReport,
)

__all__ = [
    "COMMAND_MAX_CHARS",
    "Caller",
    "PortInfo",
    "ProcessInfo",
    "SessionInfo",
    "SessionProcessesResult",
    "SessionsResult",
    "TerminateResult",
    "TerminatedInfo",
    "processes_text",
    "session_info",
    "sessions_result",
    "sessions_text",
    "terminate_result",
    "terminate_text",
    "unsettled_text",
]

#: The longest command line a tool returns, characters; a longer one ends with "…".
COMMAND_MAX_CHARS: Final = 200
#: Processes of one session the text of ``list_sessions`` names (all are in the structured content).
TEXT_PROCESSES_PER_SESSION: Final = 10
#: Processes the text of ``session_processes`` names (all are in the structured content).
TEXT_PROCESSES: Final = 100


_YOURS: Final = (
    "the session this server runs in (CAPSULE_SESSION_ID, else the session that lists "
    "its agent host)"
)


class PortInfo(BaseModel):
    """A socket a process listens on (docs/design.md §13 "Ports")."""

    proto: str = Field(description="tcp (listening) or udp (bound, not connected)")
    address: str = Field(description="the local address: 0.0.0.0 or :: for every interface")
    port: int


class ProcessInfo(BaseModel):
    """One live process of a session."""

    pid: int
    kind: ProcessKind = Field(
        description="provider_client or exec (from a receipt), process (registered by pid), "
        "descendant (started by one of those)"
    )
    command: str | None = Field(
        description=f"its command line as the OS says it, cut at {COMMAND_MAX_CHARS} "
        "characters; null where the OS does not say (another user's process, a zombie)"
    )
    receipt_command: str | None = Field(
        None, description="for an exec: the command its runtime wrote in the receipt"
    )
    started_at: int = Field(description="start time, Unix seconds")
    started: str = Field(description="start time, ISO 8601 in the machine's time zone")
    age_s: int = Field(description="seconds it has run, at the observation")
    parent_pid: int | None = Field(None, description="a descendant's parent when first seen")
    root_pid: int | None = Field(None, description="the process a descendant descends from")
    this_agent: bool = Field(
        False,
        description="this MCP server or a process that started it (the agent host): "
        "stopping the session stops it too",
    )
    cpu_percent: float | None = Field(
        None, description="CPU use over the last half second, 100 = one core (usage: true)"
    )
    rss_bytes: int | None = Field(None, description="resident memory, bytes (usage: true)")
    ports: list[PortInfo] | None = Field(
        None,
        description="the sockets it listens on ([] none); null where the OS does not say "
        "(another user's process)",
    )


_STATE = Field(
    description="running while one of its own processes (the agent, its launcher, a "
    "process with a receipt) lives; ended when only processes it left behind remain",
)
_ENDED_AT = Field(
    None,
    description="for an ended session: when its last own process went, Unix seconds "
    "(null when capsuled did not see it go)",
)


class SessionInfo(BaseModel):
    """An active session and its live processes."""

    session_id: str
    context_id: str | None
    yours: bool = Field(description=_YOURS)
    state: SessionState = _STATE
    ended_at: float | None = _ENDED_AT
    cpu_percent: float | None = Field(
        None, description="its processes' CPU use added up, 100 = one core (usage: true)"
    )
    rss_bytes: int | None = Field(
        None,
        description="its processes' resident memory added up, bytes; a page two of them "
        "share counts for each (usage: true)",
    )
    processes: list[ProcessInfo]


class SessionsResult(BaseModel):
    """What ``list_sessions`` answers."""

    observed_at: float = Field(description="when capsuled observed this, Unix seconds")
    your_session: str | None = Field(
        description="the session this server runs in (CAPSULE_SESSION_ID, else the session "
        "that lists its agent host); null when neither says"
    )
    sessions: list[SessionInfo]
    unowned_receipts: int = Field(description="live receipt processes no session owns")
    gaps: list[str] = Field(description="what the answer could not cover, in words")


class SessionProcessesResult(BaseModel):
    """What ``session_processes`` answers: one session's live processes."""

    observed_at: float = Field(description="when capsuled observed this, Unix seconds")
    session_id: str
    context_id: str | None
    yours: bool = Field(description=_YOURS)
    state: SessionState | None = Field(
        None,
        description="running, or ended when only processes it left behind remain; null when "
        "nothing of it runs",
    )
    ended_at: float | None = _ENDED_AT
    processes: list[ProcessInfo]
    gaps: list[str] = Field(description="what the answer could not cover, in words")


class TerminatedInfo(BaseModel):
    """One process ``terminate_session`` signalled or found, and what became of it."""

    pid: int
    kind: ProcessKind
    started_at: int = Field(description="start time, Unix seconds")
    outcome: TerminateOutcome = Field(
        description="exited (after the first signal), killed (SIGKILL after the grace), "
        "gone (had exited before it was signalled), refused (may not be signalled), "
        "spared (this agent: left running on purpose)"
    )
    error: str | None = Field(None, description="why, for refused")
    command: str | None = Field(None, description="its command line, as in session_processes")


class TerminateResult(BaseModel):
    """What ``terminate_session`` answers: the daemon's terminate report."""

    session_id: str
    processes: list[TerminatedInfo]
    duration_ms: int = Field(description="from the first signal to the last exit, milliseconds")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks: the server's own session and the processes that are "this agent".

    Attributes:
        session_id: the server's session: ``CAPSULE_SESSION_ID``, else the session
            that lists the server or its nearest ancestor; None when neither says.
        processes: (pid, start time in Unix seconds) of this server and its ancestors.
        may_terminate: ``--allow-terminate`` was given.
        any_session: ``--any-session`` was given.
        spares: ``terminate_session`` spares this agent (no ``--spare-none``).
    """

    #: A listed start time (whole seconds, from the store or a receipt) matches one read
    #: from ``/proc`` within this many seconds.
    START_TOLERANCE_S: ClassVar[float] = 1.5

    session_id: str | None
    processes: frozenset[tuple[int, float]] = frozenset()
    may_terminate: bool = False
    any_session: bool = False
    spares: bool = True

    def is_this_agent(self, pid: int, started_at: int) -> bool:
        """Whether (pid, start) is this server or an ancestor (start within a second)."""
        return any(
            p == pid and abs(s - started_at) < self.START_TOLERANCE_S for p, s in self.processes
        )


def _command(argv: list[str] | UnsetType | None) -> str | None:
    """A process's argv from the daemon as one command line (``shlex.join``), cut at
    :data:`COMMAND_MAX_CHARS` with a final "…"; None where the OS does not say."""
    line = command_line(argv)
    if line is None or len(line) <= COMMAND_MAX_CHARS:
        return line
    return line[: COMMAND_MAX_CHARS - 1] + "…"


def _started(unix_s: int) -> str:
    try:
        return datetime.fromtimestamp(unix_s, tz=UTC).astimezone().isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return "not a calendar date"


def process_info(process: SessionProcess, observed_at: float, caller: Caller) -> ProcessInfo:
    """A wire process as a tool returns it (age at ``observed_at``)."""
    return ProcessInfo(
        pid=process.pid,
        kind=process.kind,
        command=_command(process.command),
        receipt_command=None if process.receipt_command is UNSET else process.receipt_command,
        started_at=process.started_at,
        started=_started(process.started_at),
        age_s=max(0, int(observed_at - process.started_at)),
        parent_pid=None if process.parent_pid is UNSET else process.parent_pid,
        root_pid=None if process.root_pid is UNSET else process.root_pid,
        this_agent=caller.is_this_agent(process.pid, process.started_at),
        cpu_percent=None if process.cpu_percent is UNSET else process.cpu_percent,
        rss_bytes=None if process.rss_bytes is UNSET else process.rss_bytes,
        ports=_ports(process.ports),
    )


def _ports(ports: list[ListeningSocket] | UnsetType | None) -> list[PortInfo] | None:
    if not isinstance(ports, list):
        return None
    return [PortInfo(proto=s.proto, address=s.address, port=s.port) for s in ports]


def session_info(session: Session, observed_at: float, caller: Caller) -> SessionInfo:
    """A wire session with its processes, as the tools return it: what the agent left
    first (oldest first), then the agent's own processes."""
    usage = session.usage
    return SessionInfo(
        session_id=session.session_id,
        context_id=session.context_id,
        yours=session.session_id == caller.session_id,
        state=session.state,
        ended_at=None if isinstance(session.ended_at, UnsetType) else session.ended_at,
        cpu_percent=None if isinstance(usage, UnsetType) else usage.cpu_percent,
        rss_bytes=None if isinstance(usage, UnsetType) else usage.rss_bytes,
        processes=sorted(
            (process_info(p, observed_at, caller) for p in session.processes),
            key=lambda p: (p.this_agent, p.started_at, p.pid),
        ),
    )


def sessions_result(snapshot: ActiveSessionsSnapshot, caller: Caller) -> SessionsResult:
    """``list_sessions``: every active session, the caller's first."""
    sessions = sorted(
        (session_info(s, snapshot.observed_at, caller) for s in snapshot.sessions),
        key=lambda s: (not s.yours, s.session_id),
    )
    return SessionsResult(
        observed_at=snapshot.observed_at,
        your_session=caller.session_id,
        sessions=sessions,
        unowned_receipts=len(snapshot.unowned),
        gaps=snapshot.gaps,
    )


def terminate_result(report: TerminateReport) -> TerminateResult:
    """``terminate_session``: the daemon's report, as the tool returns it."""
    return TerminateResult(
        session_id=report.session_id,
        processes=[
            TerminatedInfo(
                pid=p.pid,
                kind=p.kind,
                started_at=p.started_at,
                outcome=p.outcome,
                error=None if p.error is UNSET else p.error,
                command=_command(p.command),
            )
            for p in report.processes
        ],
        duration_ms=report.duration_ms,
    )


def _process_line(process: ProcessInfo) -> str:
    if process.command is not None:
        what = inert(process.command)  # a command line, as capsulectl shows it (text.py)
    elif process.receipt_command is not None:
        what = one_line(process.receipt_command) + " (as its receipt says)"
    else:
        what = "(command unknown)"
    how: str = process.kind
    if process.kind == "descendant" and process.parent_pid is not None:
        how = f"descendant of pid {process.parent_pid}"
    line = f"- pid {process.pid}: {what} — {how}, running for {duration(process.age_s)}"
    if process.cpu_percent is not None and process.rss_bytes is not None:
        line += f", CPU {process.cpu_percent:.0f}%, memory {process.rss_bytes / 2**20:.0f} MiB"
    if process.ports:
        listening = ", ".join(f"{p.proto} {_endpoint(p)}" for p in process.ports)
        line += f", listening on {listening}"
    if process.this_agent:
        line += " (this agent)"
    return line


def _endpoint(port: PortInfo) -> str:
    address = f"[{port.address}]" if ":" in port.address else port.address
    return f"{one_line(address)}:{port.port}"


def _state_text(state: SessionState | None, ended_at: float | None, observed_at: float) -> str:
    """`` — ended 2h ago, only what it left behind runs``, or "" while it runs."""
    if state != "ended":
        return ""
    when = "" if ended_at is None else f" {duration(max(observed_at - ended_at, 0.0))} ago"
    return f" — ended{when}: its own processes are gone, only what it left behind runs"


def _lines(processes: Sequence[ProcessInfo], limit: int) -> Iterable[str]:
    shown = processes[:limit]
    yield from (_process_line(p) for p in shown)
    if len(processes) > len(shown):
        yield f"- and {len(processes) - len(shown)} more (in the structured result)"


def _how_to_stop(session_id: str, caller: Caller) -> str:
    """What the user (or the model) can do about a session's processes."""
    mine = session_id == caller.session_id
    if caller.may_terminate and (mine or caller.any_session):
        tool = "terminate_session" + ("" if mine else f' with session_id "{session_id}"')
        whom = (
            "this agent included if it is listed"
            if not caller.spares
            else "but this agent's own, which are spared"
        )
        return (
            f"To stop the whole session, call {tool} (every process above, {whom}); "
            "to stop one process, `kill PID`."
        )
    return (
        f"To stop them, the user can run `capsulectl terminate {session_id}` "
        "(or `kill PID` for one); this server stops sessions only when the user "
        "starts it with `capsulectl mcp --allow-terminate`"
        + ("" if mine else " --any-session")
        + "."
    )


def _gap_lines(gaps: Sequence[str]) -> list[str]:
    return [f"Not covered: {one_line(gap)}" for gap in gaps]


def sessions_text(result: SessionsResult, caller: Caller) -> str:
    """The model's reading of ``list_sessions``."""
    count = len(result.sessions)
    lines = [f"{count} active session{'' if count == 1 else 's'} (sessions with live processes)."]
    if caller.session_id is None:
        lines.append(
            "This server does not know its own session (CAPSULE_SESSION_ID is not set and "
            "no session lists it or its agent host)."
        )
    elif not any(s.yours for s in result.sessions):
        lines.append(f"Your session {caller.session_id} has no live process.")
    for session in result.sessions:
        n = len(session.processes)
        head = f"{session.session_id}{' (yours)' if session.yours else ''}"
        if session.context_id is not None:
            head += f", context {one_line(session.context_id)}"
        lines.append(
            f"{head}: {n} process{'' if n == 1 else 'es'}"
            + _state_text(session.state, session.ended_at, result.observed_at)
        )
        lines.extend(_lines(session.processes, TEXT_PROCESSES_PER_SESSION))
    if result.unowned_receipts:
        lines.append(f"{result.unowned_receipts} live receipt processes belong to no session.")
    lines.extend(_gap_lines(result.gaps))
    if result.sessions:
        lines.append(
            "session_processes {session_id} lists one session whole. "
            + _how_to_stop(result.sessions[0].session_id, caller)
        )
    return "\n".join(lines)


def processes_text(result: SessionProcessesResult, caller: Caller) -> str:
    """The model's reading of ``session_processes``."""
    whose = "Your session" if result.yours else "Session"
    n = len(result.processes)
    if n == 0:
        lines = [f"{whose} {result.session_id} has no live process: nothing of it runs."]
    else:
        lines = [
            f"{whose} {result.session_id} has {n} live process{'' if n == 1 else 'es'}"
            + _state_text(result.state, result.ended_at, result.observed_at)
            + ":"
        ]
        lines.extend(_lines(result.processes, TEXT_PROCESSES))
    lines.extend(_gap_lines(result.gaps))
    if n:
        lines.append(_how_to_stop(result.session_id, caller))
    return "\n".join(lines)


def terminate_text(result: TerminateResult) -> str:
    """The model's reading of ``terminate_session``: what stopped, what was spared."""
    if not result.processes:
        return f"Session {result.session_id} had no live process: nothing was stopped."
    counts: dict[str, int] = {}
    for process in result.processes:
        counts[process.outcome] = counts.get(process.outcome, 0) + 1
    said = {
        "exited": "exited after SIGTERM",
        "killed": "killed with SIGKILL after the grace",
        "gone": "had already exited",
        "refused": "may not be signalled",
        "spared": "spared (this agent: left running)",
    }
    parts = [f"{counts[o]} {said[o]}" for o in said if o in counts]
    lines = [
        f"Session {result.session_id}: {counted(len(result.processes), 'process')} in "
        f"{result.duration_ms} ms — " + ", ".join(parts) + "."
    ]
    for process in result.processes:
        command = inert(process.command) if process.command else "(command unknown)"
        if process.outcome == "refused":
            error = one_line(process.error or "no reason given")
            lines.append(f"- pid {process.pid}: {command} was not stopped: {error}")
        else:
            lines.append(f"- pid {process.pid}: {command} — {said[process.outcome]}")
    if "refused" in counts:
        lines.append("The user can stop those by hand (`sudo kill PID` where that is theirs).")
    if "spared" in counts:
        lines.append(
            "The spared processes are this agent (its host, this server, a launcher it runs "
            "under): they were not signalled and go on."
        )
    return "\n".join(lines)


def unsettled_text(snapshot: ActiveSessionsSnapshot) -> str | None:
    """The tool error for an answer that is not ``ready`` (it lists no session, whatever
    runs): what is wrong, what fixes it, what to do; None for a ``ready`` answer."""
    lines = unsettled(snapshot.discovery, snapshot.gaps)
    if not lines:
        return None
    lines.append(
        "capsuled cannot say now which processes run, nor that none do. Tell the user "
        "what is wrong above (`capsulectl status` tells them more), then call this "
        "tool again."
    )
    return "\n".join(lines)
