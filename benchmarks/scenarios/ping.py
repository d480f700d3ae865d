"""Scenario 6: ``ping`` requests/s against a bare asyncio NDJSON echo server (information only).

This scenario has no target: it is short, and shows the request path's
cost beside the bare floor of an asyncio server.

Both servers run as their own processes; the load comes from a third
(:mod:`benchmarks.loadgen`), the same program for both, so the client's cost
is the same. Rounds alternate between the two servers (echo, daemon, echo,
daemon, ...) so that drift in the machine's speed hits both alike; each
cell is the median over the rounds.

Beside requests/s, each server's CPU time per request (user + system, from
the kernel's accounting, over the whole load run) is shown: it is less
sensitive than throughput to other work on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks.daemon import DaemonProcess, wait_for_socket
from benchmarks.harness import ROOT, Context, Outcome, Table, Verdict, report
from benchmarks.loadgen import LoadResult
from benchmarks.stats import fmt_count, fmt_ratio, fmt_s

__all__ = ["run"]

CONCURRENCY = (1, 4, 16)

PING = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
PONG = '"pong":true'
ECHO_EXPECT = '"method":"ping"'


@dataclass(frozen=True, slots=True)
class _Run:
    load: LoadResult
    cpu_per_request_s: float


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _load(ctx: Context, socket_path: Path, server_pid: int, clients: int, expect: str) -> _Run:
    command = [
        sys.executable,
        "-m",
        "benchmarks.loadgen",
        str(socket_path),
        "--clients",
        str(clients),
        "--warmup-s",
        str(ctx.size(quick=0.1, full=0.3)),
        "--duration-s",
        str(ctx.size(quick=0.4, full=1.0)),
        "--request",
        PING,
        "--expect",
        expect,
    ]
    cpu_before = _cpu_s(server_pid)
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=120, cwd=ROOT
    )
    cpu_s = _cpu_s(server_pid) - cpu_before
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{done.stderr}")
    load = LoadResult(**json.loads(done.stdout))
    return _Run(load, cpu_s / load.total)


def _median(runs: list[_Run]) -> _Run:
    by_rate = sorted(runs, key=lambda r: r.load.per_s)
    return by_rate[len(by_rate) // 2]


def _row(clients: int, ours: _Run, base: _Run) -> list[str]:
    return [
        str(clients),
        fmt_count(ours.load.per_s),
        fmt_count(base.load.per_s),
        fmt_ratio(ours.load.per_s / base.load.per_s),
        f"{fmt_s(ours.load.p50_s)} / {fmt_s(ours.load.p99_s)}",
        f"{fmt_s(base.load.p50_s)} / {fmt_s(base.load.p99_s)}",
        f"{fmt_s(ours.cpu_per_request_s)} / {fmt_s(base.cpu_per_request_s)}",
    ]


def run(ctx: Context) -> Outcome:
    """Measure both servers at each concurrency; report the ratio at each (no target)."""
    scratch = ctx.scratch("ping")
    echo_socket = scratch / "echo.sock"
    echo = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.echo_server", str(echo_socket)],
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    rounds = ctx.size(quick=1, full=3)
    rows: list[list[str]] = []
    verdicts: list[Verdict] = []
    try:
        wait_for_socket(echo_socket, echo, timeout_s=10.0, ping=False)
        with DaemonProcess(scratch / "home", scratch / "d.sock", log_level="warning") as daemon:
            for clients in CONCURRENCY:
                daemon_runs: list[_Run] = []
                echo_runs: list[_Run] = []
                for _ in range(rounds):
                    echo_runs.append(_load(ctx, echo_socket, echo.pid, clients, ECHO_EXPECT))
                    daemon_runs.append(_load(ctx, daemon.socket_path, daemon.pid, clients, PONG))
                ours, base = _median(daemon_runs), _median(echo_runs)
                ratio = ours.load.per_s / base.load.per_s
                ctx.log(
                    f"6: {clients} clients: daemon {ours.load.per_s:,.0f}/s, "
                    f"echo {base.load.per_s:,.0f}/s ({ratio:.2f}x)"
                )
                rows.append(_row(clients, ours, base))
                verdicts.append(
                    report(f"ping/s against the echo server ({clients} clients)", fmt_ratio(ratio))
                )
    finally:
        echo.kill()
        echo.wait(timeout=10)
    table = Table(
        columns=[
            "clients",
            "daemon ping/s",
            "echo lines/s",
            "ratio",
            "daemon p50 / p99",
            "echo p50 / p99",
            "server CPU per request: daemon / echo",
        ],
        rows=rows,
    )
    notes = [
        "Closed loop: each client connection keeps one request in flight. "
        "The load generator is one separate process (one thread, epoll), "
        "the same for both servers.",
        f"Each cell is the median of {rounds} round(s) of "
        f"{ctx.size(quick=0.4, full=1.0)} s after a {ctx.size(quick=0.1, full=0.3)} s warm-up, "
        "the two servers alternating.",
        "The daemon runs with `--log-level warning`; the echo server parses nothing.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
