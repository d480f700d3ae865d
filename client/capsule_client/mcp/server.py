"""``capsulectl mcp``: an MCP server on stdio that gives an agent capsuled's answers
(docs/design.md §11).

Built on the official SDK (``mcp``, the extra ``capsuled[mcp]``); only
``capsulectl mcp`` imports this package. Tools: ``list_sessions`` and
``session_processes`` (read-only), and ``terminate_session`` with
``--allow-terminate`` (destructive; the caller's own session unless
``--any-session``, sparing the server and the processes it runs under unless
``--spare-none``). The caller's own session is ``CAPSULE_SESSION_ID``, else the
session that lists the server or its nearest ancestor (an agent host its hooks
registered, docs/design.md §11, §12). Every failure a model can act on is a
tool error (``isError``) whose text says what to do; a bad call never ends the
server.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import anyio
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from ..async_client import AsyncClient
from ..errors import (
    CapsuleError,
    ConnectionLost,
    DaemonNotRunning,
    DiscoveryUnavailable,
    InvalidParams,
    NoSuchSession,
    RemoteError,
    RequestTimeout,
)
from ..kit.proc import boot_time_s, read_stat, start_time_s, ticks_per_s
from ..text import one_line
from ..wire import DEFAULT_GRACE_MS, MAX_PARAM_MS, ActiveSessionsSnapshot, TerminateReport
from .answers import (
    Caller,
    SessionProcessesResult,
    SessionsResult,
    TerminateResult,
    processes_text,
    session_info,
    sessions_result,
    sessions_text,
    terminate_result,
    terminate_text,
    unsettled_text,
)

__all__ = ["SESSION_VARIABLE", "McpOptions", "build_server", "serve"]


class ToolFailure(Exception):
    """A call the tool cannot answer: its message is the tool error's text, for a model."""


#: Where the server learns its own session: ``capsulectl run`` exports it (docs/design.md §10).
SESSION_VARIABLE: Final = "CAPSULE_SESSION_ID"
#: Seconds between the two looks that measure CPU use (``usage: true``).
USAGE_INTERVAL_S: Final = 0.5
#: The most ancestors read for ``this_agent`` (a guard: the chain ends at pid 1).
MAX_ANCESTORS: Final = 64

INSTRUCTIONS: Final = (
    "capsuled knows every process an agent session started, by any means, with the "
    "processes those started. Before starting a server or a watcher in the background, "
    "call session_processes to see whether one already runs; list_sessions shows every "
    "active session on this machine."
)


@dataclass(frozen=True, slots=True)
class McpOptions:
    """How ``capsulectl mcp`` was started.

    Attributes:
        socket_path: the daemon's socket (docs/design.md §2).
        timeout_s: seconds to wait for each reply of the daemon.
        allow_terminate: list ``terminate_session``.
        any_session: let it stop sessions other than the caller's own.
        session_id: the caller's session (``CAPSULE_SESSION_ID``), None when not
            set: then the session that lists the server or its nearest ancestor.
        spare_none: ``terminate_session`` spares nothing, not even this agent.
    """

    socket_path: Path
    timeout_s: float
    allow_terminate: bool = False
    any_session: bool = False
    session_id: str | None = None
    spare_none: bool = False


SessionArgument = Annotated[
    str | None,
    Field(
        description="an active session's id (ses_...); default: this server's own session "
        "(CAPSULE_SESSION_ID, else the session its agent host is registered in)"
    ),
]
GraceArgument = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_PARAM_MS,
        description="milliseconds the processes have to exit after SIGTERM before SIGKILL",
    ),
]
UsageArgument = Annotated[
    bool, Field(description="also measure each process's CPU and memory (takes half a second)")
]


def _ancestry() -> tuple[tuple[int, float], ...]:
    """(pid, start time) of this server and each process it descends from, nearest
    first (Linux's ``/proc``; elsewhere, or if one cannot be read, as far as was read)."""
    chain: list[tuple[int, float]] = []
    try:
        boot_s, ticks = boot_time_s(), ticks_per_s()
        pid = os.getpid()
        while pid > 0 and len(chain) < MAX_ANCESTORS:
            stat = read_stat(pid)
            chain.append((pid, start_time_s(stat.start_ticks, boot_s, ticks)))
            pid = stat.ppid
    except (OSError, ValueError):
        pass  # no /proc, or an ancestor gone meanwhile: the ones read are kept
    return tuple(chain)


def _listing_session(
    snapshot: ActiveSessionsSnapshot, chain: tuple[tuple[int, float], ...]
) -> str | None:
    """The session that lists the nearest of ``chain`` (the server first, then its
    parent, ...) as one of its processes; None when none does (docs/design.md §11)."""
    listed = [(p.pid, p.started_at, s.session_id) for s in snapshot.sessions for p in s.processes]
    for pid, start in chain:
        for listed_pid, started_at, session_id in listed:
            if listed_pid == pid and abs(started_at - start) < Caller.START_TOLERANCE_S:
                return session_id
    return None


def _caller(options: McpOptions, snapshot: ActiveSessionsSnapshot | None = None) -> Caller:
    """The caller now: this server and its ancestors (a parent may have exited since),
    and its session: ``CAPSULE_SESSION_ID``, else the one ``snapshot`` lists it in."""
    chain = _ancestry()
    session_id = options.session_id
    if session_id is None and snapshot is not None:
        session_id = _listing_session(snapshot, chain)
    return Caller(
        session_id,
        frozenset(chain),
        options.allow_terminate,
        options.any_session,
        spares=not options.spare_none,
    )


def _error_text(exc: CapsuleError) -> str:
    """What a model reads when the daemon cannot answer, and what to do about it."""
    if isinstance(exc, DaemonNotRunning):
        return (
            f"capsuled is not running: nothing accepts connections on {exc.socket_path}. "
            "Ask the user to start it (`capsuled` in a terminal, or "
            "`systemctl --user start capsuled`), then call this tool again."
        )
    if isinstance(exc, DiscoveryUnavailable):
        return (
            f"capsuled cannot say now which processes run: {exc.message}. "
            "Try again in a few seconds; `capsulectl status` tells the user why."
        )
    if isinstance(exc, RequestTimeout | ConnectionLost):
        return (
            f"capsuled did not answer ({exc}). Try again; if it keeps failing, "
            "ask the user to check `capsulectl status`."
        )
    if isinstance(exc, RemoteError):
        return f"capsuled answered error {exc.code}: {exc.message}"
    return f"capsuled could not be asked: {exc}"


@asynccontextmanager
async def _daemon(options: McpOptions) -> AsyncIterator[AsyncClient]:
    """A client of the daemon for one tool call; its failures become tool errors."""
    try:
        async with AsyncClient(options.socket_path, timeout_s=options.timeout_s) as client:
            yield client
    except CapsuleError as exc:
        raise ToolFailure(_error_text(exc)) from exc


async def _snapshot(client: AsyncClient, usage: bool) -> ActiveSessionsSnapshot:
    """A read-your-writes answer with each process's ports; with ``usage``, CPU measured
    between two looks.

    Raises:
        ToolFailure: the answer is not ``ready``: it lists no session, whatever runs.
    """
    snapshot = await client.snapshot(usage=usage, fresh=True, commands=True, ports=True)
    if usage:
        await anyio.sleep(USAGE_INTERVAL_S)
        snapshot = await client.snapshot(usage=True, fresh=True, commands=True, ports=True)
    if (text := unsettled_text(snapshot)) is not None:
        raise ToolFailure(text)
    return snapshot


def _no_session_text(tool: str) -> str:
    return (
        f"{tool} needs a session: this server does not know its own (the variable "
        f"{SESSION_VARIABLE} is not set, so the agent host was not started inside "
        "`capsulectl run`, and no session lists this server or a process it runs under, "
        "so the host's hooks did not register it). Pass session_id (list_sessions shows "
        "the active sessions), or ask the user to run `capsulectl integrate claude-code` "
        "(for Claude Code) or to start the agent host as `capsulectl run -- <host>`."
    )


def _unknown_session_text(session_id: str) -> str:
    return (
        f"No active session {session_id!r}: capsuled knows no live process of it (it has "
        "ended, or the id is wrong). Call list_sessions for the active sessions and their ids."
    )


def _result(model: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=model.model_dump(mode="json"),
    )


def _failure(exc: ToolFailure) -> CallToolResult:
    """A tool error (``isError``): the text says what went wrong and what to do."""
    return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)


async def _list_sessions(options: McpOptions, usage: bool) -> CallToolResult:
    async with _daemon(options) as client:
        snapshot = await _snapshot(client, usage)
    caller = _caller(options, snapshot)
    result = sessions_result(snapshot, caller)
    return _result(result, sessions_text(result, caller))


async def _session_processes(
    options: McpOptions, session_id: str | None, usage: bool
) -> CallToolResult:
    async with _daemon(options) as client:
        snapshot = await _snapshot(client, usage)
    caller = _caller(options, snapshot)
    wanted = session_id or caller.session_id
    if wanted is None:
        raise ToolFailure(_no_session_text("session_processes"))
    session = next((s for s in snapshot.sessions if s.session_id == wanted), None)
    if session is None and wanted != caller.session_id:
        raise ToolFailure(_unknown_session_text(wanted))
    info = None if session is None else session_info(session, snapshot.observed_at, caller)
    result = SessionProcessesResult(
        observed_at=snapshot.observed_at,
        session_id=wanted,
        context_id=None if info is None else info.context_id,
        yours=wanted == caller.session_id,
        state=None if info is None else info.state,
        ended_at=None if info is None else info.ended_at,
        processes=[] if info is None else info.processes,
        gaps=snapshot.gaps,
    )
    return _result(result, processes_text(result, caller))


async def _terminate_session(
    options: McpOptions, session_id: str | None, grace_ms: int
) -> CallToolResult:
    snapshot = None
    if options.session_id is None:  # the caller's session is the one that lists it
        async with _daemon(options) as client:
            snapshot = await client.snapshot(fresh=True)
    caller = _caller(options, snapshot)
    wanted = session_id or caller.session_id
    if wanted is None:
        raise ToolFailure(_no_session_text("terminate_session"))
    if wanted != caller.session_id and not options.any_session:
        raise ToolFailure(_refused_text(wanted, caller))
    result = terminate_result(await _terminate(options, wanted, grace_ms, caller))
    return _result(result, terminate_text(result))


async def _answer(work: Awaitable[CallToolResult]) -> CallToolResult:
    """The tool's result, or its failure as a tool error."""
    try:
        return await work
    except ToolFailure as exc:
        return _failure(exc)


def build_server(options: McpOptions, *, version: str = "") -> MCPServer:
    """The MCP server with its tools (``terminate_session`` only with ``allow_terminate``)."""
    server = MCPServer(
        name="capsuled",
        title="capsuled: what agent sessions left running",
        instructions=INSTRUCTIONS,
        version=version,
        log_level="WARNING",
    )
    read_only = {"read_only_hint": True, "idempotent_hint": True, "open_world_hint": False}

    @server.tool(annotations=ToolAnnotations(title="Active sessions", **read_only))
    async def list_sessions(
        usage: UsageArgument = False,
    ) -> Annotated[CallToolResult, SessionsResult]:
        """The agent sessions on this machine that have live processes, each process with
        its pid, command line, kind, start time and age; yours first."""
        return await _answer(_list_sessions(options, usage))

    @server.tool(annotations=ToolAnnotations(title="A session's processes", **read_only))
    async def session_processes(
        session_id: SessionArgument = None, usage: UsageArgument = False
    ) -> Annotated[CallToolResult, SessionProcessesResult]:
        """What one session still runs — by default your own: every live process it
        started, by any means, with the processes those started (pid, command line, kind,
        start time, age). Check it before starting a server or a watcher in the background."""
        return await _answer(_session_processes(options, session_id, usage))

    if not options.allow_terminate:
        return server

    spared = (
        "this agent included (its host and this server), if it runs in it"
        if options.spare_none
        else "but this agent (its host, this server and what they run under), which is "
        "spared: what you left running stops, you do not"
    )

    @server.tool(
        description="Stop every live process of a session — by default your own — "
        f"{spared}: SIGTERM, then SIGKILL for what is left after grace_ms. The user "
        "allowed it by starting this server with --allow-terminate.",
        annotations=ToolAnnotations(
            title="Stop a session's processes",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )
    async def terminate_session(
        session_id: SessionArgument = None, grace_ms: GraceArgument = DEFAULT_GRACE_MS
    ) -> Annotated[CallToolResult, TerminateResult]:
        return await _answer(_terminate_session(options, session_id, grace_ms))

    return server


def _refused_text(asked: str, caller: Caller) -> str:
    session_id = one_line(asked)  # the model's own argument, spelt inert
    own = (
        f"only its own session, {caller.session_id}"
        if caller.session_id is not None
        else f"only its own session, and it has none ({SESSION_VARIABLE} is not set and "
        "no session lists it)"
    )
    return (
        f"Terminate refused: this server may stop {own}, not {session_id}. "
        f"Ask the user to run `capsulectl terminate {session_id}`, or to start this server "
        "with `capsulectl mcp --allow-terminate --any-session`."
    )


async def _terminate(
    options: McpOptions, session_id: str, grace_ms: int, caller: Caller
) -> TerminateReport:
    """``session.terminate``, sparing this agent (unless ``--spare-none``); the caller's own
    session with nothing running is an empty report.

    Spared: the server and every process it descends from, by (pid, start time); those
    the session does not list change nothing (docs/design.md §7), so the ones spared are
    its ancestors within the session: the agent host, a launcher.
    """
    spare = [(pid, round(start)) for pid, start in caller.processes] if caller.spares else []
    try:
        async with _daemon(options) as client:
            return await client.terminate(
                session_id, grace_s=grace_ms / 1000, commands=True, spare=spare
            )
    except ToolFailure as exc:
        cause = exc.__cause__
        if isinstance(cause, NoSuchSession):
            if session_id == caller.session_id:
                return TerminateReport(session_id=session_id, processes=[], duration_ms=0)
            raise ToolFailure(_unknown_session_text(session_id)) from cause
        if isinstance(cause, InvalidParams):
            raise ToolFailure(
                f"{session_id!r} is not a session id ({cause.message}). "
                "Call list_sessions for the active sessions and their ids."
            ) from cause
        raise


async def serve(options: McpOptions, *, version: str = "") -> None:
    """Serve MCP on stdin and stdout until the host closes them."""
    await build_server(options, version=version).run_stdio_async()
