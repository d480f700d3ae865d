"""Scenario 6: ``ping`` requests/s against a bare asyncio NDJSON echo server.

Both servers run as their own processes; the load comes from a third
(:mod:`benchmarks.loadgen`), the same program for both, so the client's cost
is the same. Rounds alternate between the two servers (echo, daemon, echo,
daemon, ...) so that drift in the machine's speed hits both alike; each
cell is the median over the rounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.daemon import DaemonProcess, wait_for_socket
from benchmarks.harness import ROOT, Context, Outcome, Table, Verdict, judge
from benchmarks.loadgen import LoadResult
from benchmarks.stats import fmt_count, fmt_ratio, fmt_s

__all__ = ["TARGET_RATIO", "run"]

TARGET_RATIO = 0.7
CONCURRENCY = (1, 4, 16)

PING = '{"jsonrpc":"2.0","id":1,"method":"ping"}'
PONG = '"pong":true'
ECHO_EXPECT = '"method":"ping"'


def _load(ctx: Context, socket_path: Path, clients: int, *, expect: str) -> LoadResult:
    command = [
        sys.executable,
        "-m",
        "benchmarks.loadgen",
        str(socket_path),
        "--clients",
        str(clients),
        "--warmup-s",
        str(ctx.size(quick=0.1, full=0.5)),
        "--duration-s",
        str(ctx.size(quick=0.4, full=3.0)),
        "--request",
        PING,
        "--expect",
        expect,
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=120, cwd=ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{done.stderr}")
    fields = json.loads(done.stdout)
    return LoadResult(
        requests=fields["requests"],
        elapsed_s=fields["elapsed_s"],
        p50_s=fields["p50_s"],
        p99_s=fields["p99_s"],
    )


def _median(results: list[LoadResult]) -> LoadResult:
    by_rate = sorted(results, key=lambda r: r.per_s)
    return by_rate[len(by_rate) // 2]


def run(ctx: Context) -> Outcome:
    """Measure both servers at each concurrency; judge the ratio at each."""
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
        with DaemonProcess(scratch / "home", scratch / "d.sock") as daemon:
            for clients in CONCURRENCY:
                daemon_runs: list[LoadResult] = []
                echo_runs: list[LoadResult] = []
                for _ in range(rounds):
                    echo_runs.append(_load(ctx, echo_socket, clients, expect=ECHO_EXPECT))
                    daemon_runs.append(_load(ctx, daemon.socket_path, clients, expect=PONG))
                ours, base = _median(daemon_runs), _median(echo_runs)
                ratio = ours.per_s / base.per_s
                ctx.log(
                    f"6: {clients} clients: daemon {ours.per_s:,.0f}/s, "
                    f"echo {base.per_s:,.0f}/s ({ratio:.2f}x)"
                )
                rows.append(
                    [
                        str(clients),
                        fmt_count(ours.per_s),
                        fmt_count(base.per_s),
                        fmt_ratio(ratio),
                        f"{fmt_s(ours.p50_s)} / {fmt_s(ours.p99_s)}",
                        f"{fmt_s(base.p50_s)} / {fmt_s(base.p99_s)}",
                    ]
                )
                verdicts.append(
                    judge(
                        f">= {TARGET_RATIO}x the echo server ({clients} clients)",
                        fmt_ratio(ratio),
                        ratio >= TARGET_RATIO,
                    )
                )
    finally:
        echo.kill()
        echo.wait(timeout=10)
    table = Table(
        columns=[
            "clients",
            "daemon ping/s",
            "echo server lines/s",
            "ratio",
            "daemon p50 / p99",
            "echo p50 / p99",
        ],
        rows=rows,
    )
    notes = [
        "Closed loop: each client connection keeps one request in flight. "
        "The load generator is one separate process (one thread, epoll), "
        "the same for both servers.",
        f"Each cell is the median of {rounds} round(s) of "
        f"{ctx.size(quick=0.4, full=3.0)} s after a {ctx.size(quick=0.1, full=0.5)} s warm-up, "
        "the two servers alternating.",
        "The daemon runs with `--log-level warning`; the echo server parses nothing.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
