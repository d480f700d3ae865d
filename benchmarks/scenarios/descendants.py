"""Scenario 15: descendants found after a fork, and what 100 live session processes cost idle.

**Fork -> listed.** A daemon with its default flags serves a home where one
session owns one exec receipt: a small Python process that, for each line
on its stdin, reads the monotonic clock (system-wide on Linux), forks a
``sleep`` and prints its pid and that time. The benchmark then long-polls
``sessions.snapshot`` with ``since`` until an answer lists the sleep as a
``descendant``; the latency is from the fork to that answer. Nothing else
changes, so what finds the child is the daemon's own look between
observations (docs/design.md §5, "Descendants"): the figure is bounded by the
look interval. Between trials the child is killed (its exit, from the
same long poll, is reported too) and a random pause of up to a look
interval puts the next fork at another phase of the daemon's timer.

**100 live session processes, nothing changing.** Two daemons with their
default flags, measured side by side in the same window from ``/proc``
(:mod:`benchmarks.procstat`): one on a home where a session owns 100 live
``sleep`` processes by exec receipts (so the daemon looks for descendants
every second), one on an empty home (no looks at all).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, report, require_modules
from benchmarks.homes import SleepPool
from benchmarks.procstat import IdleWindow
from benchmarks.rawclient import RawClient
from benchmarks.stats import percentile

__all__ = ["run"]

CPU_TARGET_PERCENT = 0.2
WAKEUPS_TARGET_PER_S = 2.0
LIVE_PROCESSES = 100

#: The root: forks a sleep per line on stdin ("fork"), kills it on "kill".
_FORKER = """
import os, signal, subprocess, sys, time
child = None
for line in sys.stdin:
    if line.strip() == "fork":
        at = time.monotonic()
        child = subprocess.Popen(["sleep", "300"])
        print(child.pid, at, flush=True)
    elif child is not None:
        child.kill()
        child.wait()
        print(child.pid, time.monotonic(), flush=True)
"""


def _own(home: Path, session_id: str, pids: dict[str, int]) -> None:
    """Register ``session_id`` owning each exec of ``pids`` and write its receipt."""
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.receipts import write_exec_receipt
    from capsule_client.kit.store import OwnershipStore

    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id)
        for exec_id in pids:
            store.register_exec(exec_id, session_id)
    for exec_id, pid in pids.items():
        write_exec_receipt(home, exec_id, pid, command="bench")


def _processes(answer: dict[str, Any]) -> dict[int, str]:
    """pid → kind of every session process in a snapshot result."""
    return {p["pid"]: p["kind"] for s in answer["sessions"] for p in s["processes"]}


def _until(client: RawClient, check: Any, timeout_s: float = 30.0) -> tuple[dict[str, Any], float]:
    """Long-poll with ``since`` until ``check(answer)``; the answer and when it came."""
    answer: dict[str, Any] = client.call("sessions.snapshot")  # no max_age_ms: asks for nothing
    deadline = time.monotonic() + timeout_s
    while not check(answer):
        if time.monotonic() > deadline:
            raise RuntimeError("the daemon's answer did not change in time")
        answer = client.call(
            "sessions.snapshot", {"since": answer["generation"], "timeout_ms": 10_000}
        )
    return answer, time.monotonic()


def _listed(pid: int) -> Any:
    return lambda answer: _processes(answer).get(pid) == "descendant"


def _gone(pid: int) -> Any:
    return lambda answer: pid not in _processes(answer)


def _fork_latency(ctx: Context) -> tuple[list[float], list[float]]:
    """(fork -> listed, kill -> gone) latencies in seconds, one per trial."""
    home = ctx.scratch("descendants-fork") / "home"
    home.mkdir(mode=0o700)
    forker = subprocess.Popen(
        [sys.executable, "-c", _FORKER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert forker.stdin is not None and forker.stdout is not None
    found: list[float] = []
    gone: list[float] = []
    try:
        _own(home, "ses_bench", {"exe_forker": forker.pid})
        with DaemonProcess(home, home.parent / "d.sock", log_level="warning") as daemon:
            with RawClient(daemon.socket_path) as client:
                _until(client, lambda a: forker.pid in _processes(a))
                for _ in range(ctx.size(quick=2, full=40)):
                    time.sleep(random.uniform(0.0, 1.0))
                    forker.stdin.write("fork\n")
                    forker.stdin.flush()
                    pid_text, at_text = forker.stdout.readline().split()
                    pid, forked_at = int(pid_text), float(at_text)
                    _, listed_at = _until(client, _listed(pid))
                    found.append(listed_at - forked_at)
                    forker.stdin.write("kill\n")
                    forker.stdin.flush()
                    killed_at = float(forker.stdout.readline().split()[1])
                    _, gone_at = _until(client, _gone(pid))
                    gone.append(gone_at - killed_at)
    finally:
        forker.kill()
        forker.wait(timeout=10)
    return found, gone


def _idle(ctx: Context) -> tuple[dict[str, Any], float, int]:
    """Idle figures of the two daemons (live, empty) over one window; its length; observations."""
    live_home = ctx.scratch("descendants-live") / "home"
    live_home.mkdir(mode=0o700)
    empty_home = ctx.scratch("descendants-empty") / "home"
    empty_home.mkdir(mode=0o700)
    pool = SleepPool(LIVE_PROCESSES, exited=False)
    window_s = ctx.size(quick=0.5, full=30.0)
    try:
        _own(live_home, "ses_idle", {f"exe_{pid}": pid for pid in pool.pids})
        with (
            DaemonProcess(live_home, live_home.parent / "d.sock", log_level="warning") as live,
            DaemonProcess(empty_home, empty_home.parent / "d.sock", log_level="warning") as empty,
        ):
            with RawClient(live.socket_path) as client:
                _until(client, lambda a: len(_processes(a)) >= LIVE_PROCESSES)
                before = client.call("status")["totals"]["observations"]
            time.sleep(ctx.size(quick=0.3, full=3.0))  # the start-up's tail
            figures = IdleWindow({"live": live.pid, "empty": empty.pid}).measure(window_s)
            with RawClient(live.socket_path) as client:
                observations = client.call("status")["totals"]["observations"] - before
    finally:
        pool.close()
    return figures, window_s, observations


def _ms(samples: list[float], p: float) -> str:
    return f"{percentile(samples, p) * 1000:.0f} ms"


def _spread(samples: list[float]) -> list[str]:
    return [_ms(samples, 50), _ms(samples, 99), f"{max(samples) * 1000:.0f} ms"]


def run(ctx: Context) -> Outcome:
    """Fork latency trials, then one idle window of the two daemons."""
    require_modules("capsuled.processes.descendants", "capsule_client.kit.receipts")
    found, gone = _fork_latency(ctx)
    ctx.log(f"15: fork -> listed p50 {_ms(found, 50)}, p99 {_ms(found, 99)}")
    figures, window_s, observations = _idle(ctx)
    live, empty = figures["live"], figures["empty"]
    ctx.log(
        f"15: 100 live: {live.cpu_percent:.3f} %, {live.wakeups_per_s:.2f}/s; "
        f"empty: {empty.cpu_percent:.3f} %, {empty.wakeups_per_s:.2f}/s"
    )
    verdicts = [
        report(
            "descendant found after a fork: p50 / p99 (a since long poll)",
            f"p50 {_ms(found, 50)}, p99 {_ms(found, 99)} over {len(found)} forks",
        ),
        judge(
            "100 live session processes, nothing changing: <= 0.2 % of a core",
            f"{live.cpu_percent:.3f} % (schedstat {live.runtime_percent:.3f} %), "
            f"{live.wakeups_per_s:.2f} wake-ups/s",
            live.cpu_percent <= CPU_TARGET_PERCENT,
        ),
        judge(
            "an empty home beside it: <= 2 wake-ups/s",
            f"{empty.cpu_percent:.3f} %, {empty.wakeups_per_s:.2f} wake-ups/s",
            empty.wakeups_per_s <= WAKEUPS_TARGET_PER_S,
        ),
    ]
    tables = [
        Table(
            columns=["event", "trials", "p50", "p99", "max"],
            rows=[
                ["fork -> listed as descendant", str(len(found)), *_spread(found)],
                ["descendant killed -> gone", str(len(gone)), *_spread(gone)],
            ],
        ),
        Table(
            columns=["home", "daemon CPU: ticks / schedstat", "daemon wake-ups/s"],
            rows=[
                [
                    f"{LIVE_PROCESSES} live session processes",
                    f"{live.cpu_percent:.3f} % / {live.runtime_percent:.3f} %",
                    f"{live.wakeups_per_s:.2f}",
                ],
                [
                    "empty",
                    f"{empty.cpu_percent:.3f} % / {empty.runtime_percent:.3f} %",
                    f"{empty.wakeups_per_s:.2f}",
                ],
            ],
        ),
    ]
    notes = [
        "Fork -> listed: from the monotonic clock read just before the fork, in the "
        "forking process, to the `since` long poll's answer that lists the child; only "
        "the daemon's look between observations (every second while a session has a live "
        "process) can find it, so the figures follow the look interval.",
        "Killed -> gone: from just after the child was reaped to the answer without it "
        "(the exit is a pidfd event).",
        f"Idle: both daemons with their default flags, measured in the same {window_s:g} s "
        f"window ({observations} observations of the live home's daemon in it). CPU is "
        "`utime + stime` (clock ticks) / the threads' schedstat run time; wake-ups are the "
        "context switches of every thread.",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
