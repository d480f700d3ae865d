"""What ``capsulectl hook claude-code`` records for each event (docs/design.md §12).

Called once :func:`~.claude_code.records` has said an event records something; the
event is decoded into its type (:mod:`.claude_code_events`) before anything is written.

* ``SessionStart``: ``session_start`` in the trace, once per Claude Code process
  (sources ``startup``, ``resume``, ``fork``, or a trace without one); the session's
  ``sessions`` row (context: the project directory) and Claude Code's process as its
  root (``session_processes``); on ``resume``, the lost-work report as
  ``additionalContext`` (:mod:`.claude_code_resume`).
* ``UserPromptSubmit``: ``task_start``, trusted; a ``<task-notification>`` prompt is a
  background command's end instead: ``shell_completed`` (``completed`` or ``failed``,
  with the exit code) or ``shell_abandoned`` (``killed`` at its time limit).
* ``PostToolUse`` of a background ``Bash``: ``shell_detached`` (the task id, the shell,
  the command, the current task); of ``TaskStop``: ``shell_abandoned``.
* ``Stop``: ``shell_completed`` (no status) for each command this Claude Code process
  detached that ``background_tasks`` no longer lists.

A work is accounted for once: every write that depends on what the trace says reads
it and appends under the trace's lock. The writes go through the writer kit (the
store's transactions, whole-line appends); each step that fails is said and the
others still run, and nothing is left half-written.

What it may import: the clients, the exceptions, the text helpers, ``kit``, ``wire``
and the other ``claude_code`` modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import msgspec
from msgspec import UNSET, Struct

from ..kit.paths import records_root, store_path
from ..kit.proc import parse_exec_mark, parse_stat, read_stat_line
from ..kit.trace import (
    SessionStart as SessionStartEvent,
)
from ..kit.trace import (
    ShellAbandoned,
    ShellCompleted,
    ShellDetached,
    TaskStart,
    TraceEvent,
    append_event,
    append_locked,
    encode_line,
    locked_trace,
    new_event_id,
    new_task_id,
    now_ms,
)
from .claude_code import runs_background_command, session_name
from .claude_code_events import (
    BashInput,
    BashResponse,
    PostToolUse,
    SessionStart,
    Stop,
    TaskStopInput,
    TaskStopResponse,
    UserPromptSubmit,
    decode,
    decode_part,
    is_notification,
    task_ends,
)
from .claude_code_outcome import HookOutcome, Places

__all__ = [
    "FALLBACK_SHELL",
    "NEW_PROCESS_SOURCES",
    "SHELLS",
    "STORE_TIMEOUT_S",
    "TRACE_LOCK_TIMEOUT_S",
    "agent_process",
    "background_shell",
    "handle",
]

#: Seconds the hook waits for the store's lock, and for the trace's: a hook must not
#: hold the agent up (Claude Code waits for it), so a busy store is given up on soon.
STORE_TIMEOUT_S: Final = 1.0
TRACE_LOCK_TIMEOUT_S: Final = 3.0
#: ``SessionStart`` sources that mean a new Claude Code process (or a new session id):
#: they begin a new ``session_start`` (``clear``, ``compact`` go on in the same process).
NEW_PROCESS_SOURCES: Final = frozenset({"startup", "resume", "fork"})
#: Command names (``comm``) of the shells between a hook and its agent (hook → ``sh -c``
#: → Claude Code): the agent's process is the nearest ancestor that is none of them.
SHELLS: Final = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "tcsh", "csh", "busybox"}
)
#: The shell a background ``Bash`` runs under when its process is gone before the hook
#: looks (measured: ``/bin/bash -c '… eval CMD …'``, tests/claude_code/FINDINGS.md §6).
FALLBACK_SHELL: Final = "/bin/bash"
#: The title of a Claude Code session in the store.
TITLE: Final = "Claude Code"
#: The most ancestors read up from the hook (a guard: the chain ends at pid 1).
MAX_ANCESTORS: Final = 64


def handle(event_name: str, data: bytes, env: Mapping[str, str], places: Places) -> HookOutcome:
    """Record what ``data``, the event ``event_name`` (one :func:`~.claude_code.records`
    accepted), says.

    Raises:
        msgspec.ValidationError: the event does not fit its type (an odd session or task
            id, a member of the wrong type): nothing was recorded.
        msgspec.DecodeError: ``data`` is not JSON.
    """
    event = decode(event_name, data)
    outcome = HookOutcome()
    if isinstance(event, SessionStart):
        _session_start(event, env, places, outcome)
    elif isinstance(event, UserPromptSubmit):
        _prompt(event, places, outcome)
    elif isinstance(event, PostToolUse):
        _tool_used(event, env, places, outcome)
    elif isinstance(event, Stop):
        _stopped(event, places, outcome)
    return outcome


# --------------------------------------------------------------------------
# What the trace says (read under its lock)


class _Line(Struct):
    """The members of a trace line the hook reads; a line that is not this is skipped."""

    event_type: str = ""
    task_id: str | None = None
    work_id: str | None = None
    binary: str = ""
    command: str = ""


_line: Final = msgspec.json.Decoder(_Line)


@dataclass(slots=True)
class _Work:
    binary: str
    command: str
    #: Detached after the trace's last ``session_start``: by this Claude Code process.
    this_process: bool = True


@dataclass(slots=True)
class _TraceState:
    started: bool = False
    task_id: str | None = None
    works: dict[str, _Work] = field(default_factory=dict)
    accounted: set[str] = field(default_factory=set)

    def open_work(self, work_id: str) -> _Work | None:
        """The work ``work_id`` if it was detached and is not accounted for."""
        return None if work_id in self.accounted else self.works.get(work_id)


def _read_all(fd: int) -> bytes:
    size, parts, offset = os.fstat(fd).st_size, [], 0
    while offset < size:
        part = os.pread(fd, min(size - offset, 1 << 20), offset)
        if not part:
            break
        parts.append(part)
        offset += len(part)
    return b"".join(parts)


def _scan(fd: int) -> _TraceState:
    """What the trace says, read as reconcile reads it (docs/design.md §6): a line that
    is not a JSON object of the expected member types is skipped."""
    state = _TraceState()
    for raw in _read_all(fd).split(b"\n"):
        if not raw.strip():
            continue
        try:
            line = _line.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        kind = line.event_type
        if kind == "session_start":
            state.started = True
            for work in state.works.values():
                work.this_process = False
        elif kind == "task_start" and line.task_id is not None:
            state.task_id = line.task_id
        elif kind == "shell_detached" and line.work_id is not None:
            state.works[line.work_id] = _Work(line.binary, line.command)
        elif kind in ("shell_completed", "shell_abandoned", "shell_lost") and line.work_id:
            state.accounted.add(line.work_id)
    return state


def _stamp(session: str) -> tuple[str, str, int]:
    """The members every event begins with, in order: a new event id, the session, now."""
    return new_event_id(), session, now_ms()


def _in_trace(
    places: Places,
    session: str,
    decide: Callable[[_TraceState], list[TraceEvent]],
    outcome: HookOutcome,
) -> None:
    """Read the trace and append what ``decide`` makes of it, both under its lock, in
    one write; a failure is said in ``outcome.problems``."""
    try:
        with locked_trace(
            records_root(places.home), session, lock_timeout_s=TRACE_LOCK_TIMEOUT_S
        ) as fd:
            events = decide(_scan(fd))
            if events:
                append_locked(fd, b"".join(encode_line(e) for e in events), fsync=False)
    except (OSError, ValueError) as exc:
        outcome.problems.append(f"the trace of {session} was not written: {exc}")
        return
    outcome.did.extend(_what(event) for event in events)


def _what(event: TraceEvent) -> str:
    """``shell_detached b12ab``: the event's type and the work or task it is about."""
    about = getattr(event, "work_id", None) or getattr(event, "task_id", None)
    tag = str(event.__struct_config__.tag)
    return tag if about is None else f"{tag} {about}"


# --------------------------------------------------------------------------
# SessionStart


def _session_start(
    event: SessionStart, env: Mapping[str, str], places: Places, outcome: HookOutcome
) -> None:
    session = session_name(event.session_id)

    def started(state: _TraceState) -> list[TraceEvent]:
        if state.started and event.source not in NEW_PROCESS_SOURCES:
            return []  # a clear or a compaction in the same process
        return [SessionStartEvent(*_stamp(session))]

    _in_trace(places, session, started, outcome)
    from ..kit.store import OwnershipStore  # sqlite3: for SessionStart alone

    try:
        agent = agent_process(env)
        with OwnershipStore(store_path(places.home), busy_timeout_s=STORE_TIMEOUT_S) as store:
            store.ensure_session(session, context_id=event.cwd or None, title=TITLE)
            store.register_process(agent, session)
        outcome.did.append(f"session {session}, root pid {agent}")
    except Exception as exc:  # a locked or unwritable store, no agent process: say it
        outcome.problems.append(f"the store was not written: {_reason(exc)}")
    if event.source == "resume":
        from .claude_code_resume import resume_context

        context = resume_context(session, event.cwd, places, outcome)
        if context is not None:
            import json

            outcome.output = json.dumps(
                {
                    "hookSpecificOutput": {
                        "hookEventName": "SessionStart",
                        "additionalContext": context,
                    }
                }
            )


def _reason(exc: BaseException) -> str:
    """Why a step failed: the error's words, with its class where they are not enough."""
    text = str(exc) or exc.__class__.__name__
    known = isinstance(exc, OSError | LookupError) or exc.__class__.__module__ == "sqlite3"
    return text if known else f"{exc.__class__.__name__}: {text}"


def agent_process(env: Mapping[str, str]) -> int:
    """The agent's process: ``CLAUDE_PID`` when it names an ancestor of this hook, else
    the nearest ancestor that is not a shell (:data:`SHELLS`); pid 1 never is.

    Where no ``/proc`` can be read, ``CLAUDE_PID`` is taken as it is.

    Raises:
        LookupError: neither names a process.
    """
    claimed = env.get("CLAUDE_PID", "")
    claimed_pid = int(claimed) if claimed.isdigit() and int(claimed) > 1 else None
    try:
        chain = _ancestors()
    except OSError:
        if claimed_pid is not None:
            return claimed_pid
        raise LookupError("no CLAUDE_PID, and the process table cannot be read") from None
    if claimed_pid is not None and any(pid == claimed_pid for pid, _ in chain):
        return claimed_pid
    for pid, comm in chain:
        if comm not in SHELLS:
            return pid
    raise LookupError("CLAUDE_PID names no ancestor, and every ancestor is a shell")


def _ancestors() -> list[tuple[int, str]]:
    """(pid, command name) of each ancestor of this process, nearest first, up to pid 1
    (left out).

    Raises:
        OSError: the parent's ``/proc`` entry could not be read.
    """
    chain: list[tuple[int, str]] = []
    pid = os.getppid()
    while pid > 1 and len(chain) < MAX_ANCESTORS:
        try:
            line = read_stat_line(pid)
        except OSError:
            if not chain:
                raise
            break  # exited meanwhile: the chain ends here
        chain.append((pid, parse_exec_mark(line).comm.decode(errors="replace")))
        pid = parse_stat(line).ppid
    return chain


# --------------------------------------------------------------------------
# UserPromptSubmit: a task, or a background command's end


def _prompt(event: UserPromptSubmit, places: Places, outcome: HookOutcome) -> None:
    session = session_name(event.session_id)
    if not is_notification(event.prompt):
        task = TaskStart(*_stamp(session), task_id=new_task_id(), trust="trusted")
        try:
            append_event(records_root(places.home), task, lock_timeout_s=TRACE_LOCK_TIMEOUT_S)
        except (OSError, ValueError) as exc:
            outcome.problems.append(f"the trace of {session} was not written: {exc}")
            return
        outcome.did.append(_what(task))
        return
    ends = task_ends(event.prompt)

    def ended(state: _TraceState) -> list[TraceEvent]:
        events: list[TraceEvent] = []
        for end in ends:
            work = state.open_work(end.work_id)
            if work is None or end.status == "stopped":  # "stopped": said without looking
                continue
            state.accounted.add(end.work_id)
            if end.status == "killed":  # at its time limit: given up on, knowingly
                events.append(
                    ShellAbandoned(*_stamp(session), end.work_id, work.binary, work.command)
                )
                continue
            events.append(
                ShellCompleted(
                    *_stamp(session),
                    work_id=end.work_id,
                    binary=work.binary,
                    command=work.command,
                    status=end.status,
                    exit_code=UNSET if end.exit_code is None else end.exit_code,
                    completion_task_id=state.task_id or UNSET,
                )
            )
        return events

    _in_trace(places, session, ended, outcome)


# --------------------------------------------------------------------------
# PostToolUse: a background Bash, or TaskStop


def _tool_used(
    event: PostToolUse, env: Mapping[str, str], places: Places, outcome: HookOutcome
) -> None:
    session = session_name(event.session_id)
    if event.tool_name == "Bash":
        tool_input = decode_part(event.tool_input, BashInput)
        response = decode_part(event.tool_response, BashResponse)
        if not tool_input.run_in_background:
            return
        if response.backgroundTaskId is None:
            outcome.problems.append("a background Bash without a backgroundTaskId: not recorded")
            return
        work_id: str = response.backgroundTaskId
        binary = background_shell(env, tool_input.command)

        def detached(state: _TraceState) -> list[TraceEvent]:
            if work_id in state.works:
                return []  # told once already
            task_id = state.task_id or new_task_id()  # none: a task capsuled did not see
            return [
                ShellDetached(
                    *_stamp(session),
                    task_id=task_id,
                    work_id=work_id,
                    binary=binary,
                    command=tool_input.command,
                )
            ]

        _in_trace(places, session, detached, outcome)
    elif event.tool_name == "TaskStop":
        stop_input = decode_part(event.tool_input, TaskStopInput)
        stop_response = decode_part(event.tool_response, TaskStopResponse)
        stopped = stop_response.task_id or stop_input.task_id or stop_input.shell_id
        if stopped is None:
            outcome.problems.append("a TaskStop without a task id: not recorded")
            return
        _in_trace(places, session, _abandoning(session, stopped), outcome)


def _abandoning(session: str, work_id: str) -> Callable[[_TraceState], list[TraceEvent]]:
    def abandoned(state: _TraceState) -> list[TraceEvent]:
        work = state.open_work(work_id)
        if work is None:
            return []
        return [ShellAbandoned(*_stamp(session), work_id, work.binary, work.command)]

    return abandoned


def background_shell(env: Mapping[str, str], command: str) -> str:
    """The shell a background ``Bash`` runs ``command`` under, read from the process table:
    a child of the agent whose argv is ``SHELL -c '… eval 'COMMAND' …'`` (as Claude Code
    quotes it); :data:`FALLBACK_SHELL` when none is found (it has ended already, or the
    table cannot be read)."""
    try:
        agent = agent_process(env)
        for child in _children(agent):
            argv = _argv(child)
            if runs_background_command(argv, command):
                return argv[0]
    except (OSError, LookupError, ValueError):
        pass
    return FALLBACK_SHELL


def _children(pid: int) -> list[int]:
    """The children of ``pid``: ``/proc/<pid>/task/<tid>/children`` of each of its threads."""
    children: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as file:
                children.extend(int(part) for part in file.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return children


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            raw = file.read()
    except OSError:
        return []
    return [os.fsdecode(part) for part in raw.split(b"\0")[:-1]]


# --------------------------------------------------------------------------
# Stop: commands that ended without a word


def _stopped(event: Stop, places: Places, outcome: HookOutcome) -> None:
    session = session_name(event.session_id)
    running = {task.id for task in event.background_tasks}

    def vanished(state: _TraceState) -> list[TraceEvent]:
        return [
            ShellCompleted(*_stamp(session), work_id, work.binary, work.command)
            for work_id, work in sorted(state.works.items())
            if work.this_process and work_id not in state.accounted and work_id not in running
        ]

    _in_trace(places, session, vanished, outcome)
