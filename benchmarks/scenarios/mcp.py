"""Scenario 19: ``capsulectl mcp``, as an agent host sees it (docs/design.md §11).

Two measurements, both with the SDK's own client (``mcp.ClientSession`` over
``stdio_client``, the way a host starts an MCP server):

- start to the first answer: from spawning ``capsulectl mcp`` to the reply of
  its first ``list_sessions`` (the interpreter, the SDK's import, the MCP
  initialize handshake, then the tool's fresh snapshot), each round a new
  server; the baseline is ``capsulectl sessions --json`` run the same way,
  a process that starts, asks once and exits;
- one ``list_sessions`` at 100 active sessions of one process each, on a
  server already running: the call as the host times it; the baseline is the
  request the tool makes, ``sessions.snapshot {"max_age_ms": 0, "commands":
  true}``, sent raw over the socket.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, report, require_modules, whole_process_s
from benchmarks.homes import SleepPool
from benchmarks.rawclient import RawClient
from benchmarks.stats import percentile

__all__ = ["run"]

SESSIONS = 100


def _own(home: Path, pids: list[int]) -> None:
    """One session per pid (``ses_b<n>``), each owning its process by (pid, start) row."""
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.store import OwnershipStore

    with OwnershipStore(store_path(home)) as store:
        for number, pid in enumerate(pids):
            store.register_session(f"ses_b{number}")
            store.register_process(pid, f"ses_b{number}")


def _environment(socket_path: Path) -> dict[str, str]:
    return {**os.environ, "CAPSULED_SOCKET": str(socket_path), "CAPSULE_SESSION_ID": "ses_b0"}


async def _server_rounds(
    socket_path: Path, starts: int, calls: int
) -> tuple[list[float], list[float]]:
    """Seconds from spawn to the first ``list_sessions`` reply (``starts`` servers), then
    the seconds of ``calls`` more calls on the last one."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.types import CallToolResult

    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "capsule_client.cli", "mcp"],
        env=_environment(socket_path),
    )
    first: list[float] = []
    each: list[float] = []

    async def listed(session: ClientSession) -> None:
        result = await session.call_tool("list_sessions", {})
        assert isinstance(result, CallToolResult)
        if result.is_error or result.structured_content is None:
            raise RuntimeError(f"list_sessions failed: {result.content}")
        if len(result.structured_content["sessions"]) != SESSIONS:
            raise RuntimeError(f"{len(result.structured_content['sessions'])} sessions listed")

    with open(os.devnull, "w") as errlog:  # noqa: ASYNC230  (the servers' stderr)
        for number in range(starts):
            started = time.perf_counter()
            async with stdio_client(parameters, errlog=errlog) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=60) as session:
                    await session.initialize()
                    await listed(session)
                    first.append(time.perf_counter() - started)
                    if number == starts - 1:
                        for _ in range(calls):
                            started = time.perf_counter()
                            await listed(session)
                            each.append(time.perf_counter() - started)
    return first, each


def _sessions_command(socket_path: Path) -> float:
    """Seconds of one ``capsulectl sessions --json``, spawn to exit."""
    return whole_process_s(
        [sys.executable, "-m", "capsule_client.cli", "sessions", "--json"],
        env=_environment(socket_path),
    )


def _raw_snapshots(socket_path: Path, calls: int) -> list[float]:
    """Seconds of ``calls`` raw ``sessions.snapshot`` requests the tool makes."""
    samples = []
    with RawClient(socket_path) as client:
        for _ in range(calls):
            started = time.perf_counter()
            answer: dict[str, Any] = client.call(
                "sessions.snapshot", {"max_age_ms": 0, "commands": True}
            )
            samples.append(time.perf_counter() - started)
            if len(answer["sessions"]) != SESSIONS:
                raise RuntimeError(f"{len(answer['sessions'])} sessions in the raw snapshot")
    return samples


def _ms(samples: list[float], p: float) -> str:
    return f"{percentile(samples, p) * 1000:.1f} ms"


def _row(name: str, samples: list[float]) -> list[str]:
    return [
        name,
        str(len(samples)),
        _ms(samples, 50),
        _ms(samples, 99),
        f"{max(samples) * 1000:.1f} ms",
    ]


def run(ctx: Context) -> Outcome:
    """Servers started and timed to their first answer, then calls on the last one."""
    require_modules("mcp", "capsule_client.mcp.server")
    starts = ctx.size(quick=2, full=10)
    calls = ctx.size(quick=10, full=200)
    home = ctx.scratch("mcp") / "home"
    home.mkdir(mode=0o700)
    pool = SleepPool(SESSIONS, exited=False)
    try:
        _own(home, pool.pids)
        with DaemonProcess(home, home.parent / "d.sock", log_level="warning") as daemon:
            _raw_snapshots(daemon.socket_path, 1)  # every session listed before timing
            first, each = anyio.run(_server_rounds, daemon.socket_path, starts, calls)
            commands = [_sessions_command(daemon.socket_path) for _ in range(starts)]
            raw = _raw_snapshots(daemon.socket_path, calls)
    finally:
        pool.close()
    ctx.log(f"19: mcp first answer p50 {_ms(first, 50)}; list_sessions p50 {_ms(each, 50)}")
    verdicts = [
        report(
            "capsulectl mcp start to its first answered list_sessions",
            f"p50 {_ms(first, 50)}, max {max(first) * 1000:.1f} ms over {starts} starts "
            f"(capsulectl sessions --json p50 {_ms(commands, 50)})",
        ),
        report(
            f"list_sessions at {SESSIONS} sessions: p50 / p99",
            f"p50 {_ms(each, 50)}, p99 {_ms(each, 99)} over {calls} calls "
            f"(the raw snapshot it asks: p50 {_ms(raw, 50)})",
        ),
    ]
    tables = [
        Table(
            columns=["measured", "samples", "p50", "p99", "max"],
            rows=[
                _row("capsulectl mcp: spawn to the first list_sessions reply", first),
                _row("baseline: capsulectl sessions --json, spawn to exit", commands),
                _row(f"list_sessions at {SESSIONS} sessions, a running server", each),
                _row('baseline: raw sessions.snapshot {"max_age_ms": 0, "commands": true}', raw),
            ],
        )
    ]
    notes = [
        f"A daemon with its default flags serves a home of {SESSIONS} sessions, each owning "
        "one `sleep` by its (pid, start time) row. The SDK's own client starts "
        "`capsulectl mcp` over stdio as an agent host does and times, per start, the spawn, "
        "the initialize handshake and the first `list_sessions` (a fresh snapshot with "
        "commands, the models built and checked, the text written, all sent back and "
        "checked against the output schema by the client).",
        "The calls at the end are made on the last server started; the raw baseline is the "
        "snapshot the tool asks for, on one connection, without MCP, pydantic or the text.",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
