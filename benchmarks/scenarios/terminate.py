"""Scenario 16: ``session.terminate`` of a session of 100 processes that exit on TERM.

A daemon with its default flags serves a home where, each round, a new
session owns 100 fresh ``sleep`` processes by (pid, start time) rows. Once a
fresh snapshot lists all of them, the benchmark calls ``session.terminate``
and times the call at the client, from the request's first byte to the
reply's last: the fresh observation, 100 pidfds opened and checked, 100
signals, the waits for 100 exits, the look for new descendants that ends
the grace, and the report. The daemon's own ``duration_ms`` (first signal to
the end of the last wait) is shown beside it.

Baseline: the same 100 processes signalled by the benchmark itself
(``os.kill``) and reaped (``waitpid``), the floor of ending them at all,
measured each round on a second pool of the same size.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, report, require_modules
from benchmarks.homes import SleepPool
from benchmarks.rawclient import RawClient
from benchmarks.stats import percentile

__all__ = ["run"]

PROCESSES = 100


def _own(home: Path, session_id: str, pids: list[int]) -> None:
    """Register ``session_id`` owning each of ``pids`` by its (pid, start time) row."""
    from capsule_client.kit.paths import store_path
    from capsule_client.kit.store import OwnershipStore

    with OwnershipStore(store_path(home)) as store:
        store.register_session(session_id)
        for pid in pids:
            store.register_process(pid, session_id)


def _listed(client: RawClient, session_id: str, count: int, timeout_s: float = 30.0) -> None:
    """Until a fresh snapshot lists ``count`` processes under ``session_id``."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = client.call("sessions.snapshot", {"max_age_ms": 0})
        found = [len(s["processes"]) for s in answer["sessions"] if s["session_id"] == session_id]
        if found == [count]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{session_id} was not listed with {count} processes in time")
        time.sleep(0.01)


def _round(client: RawClient, home: Path, number: int) -> tuple[float, float]:
    """One terminate of a fresh 100-process session: (call seconds, duration_ms / 1000)."""
    session_id = f"ses_round{number}"
    pool = SleepPool(PROCESSES, exited=False)
    try:
        _own(home, session_id, pool.pids)
        _listed(client, session_id, PROCESSES)
        started = time.perf_counter()
        result: dict[str, Any] = client.call(
            "session.terminate", {"session_id": session_id, "grace_ms": 10_000}
        )
        took_s = time.perf_counter() - started
        outcomes = {p["outcome"] for p in result["processes"]}
        if len(result["processes"]) != PROCESSES or outcomes != {"exited"}:
            raise RuntimeError(f"round {number}: {len(result['processes'])} processes, {outcomes}")
        for process in pool.processes:
            if process.wait(timeout=10) != -signal.SIGTERM:
                raise RuntimeError(f"round {number}: {process.pid} did not die of TERM")
    finally:
        pool.close()
    return took_s, result["duration_ms"] / 1000


def _floor() -> float:
    """Seconds to ``kill`` 100 sleeps and reap them all, from the benchmark itself."""
    pool = SleepPool(PROCESSES, exited=False)
    try:
        started = time.perf_counter()
        for process in pool.processes:
            os.kill(process.pid, signal.SIGTERM)
        for process in pool.processes:
            process.wait(timeout=10)
        return time.perf_counter() - started
    finally:
        pool.close()


def _ms(samples: list[float], p: float) -> str:
    return f"{percentile(samples, p) * 1000:.1f} ms"


def run(ctx: Context) -> Outcome:
    """Rounds of terminate (each with its floor), one daemon for all of them."""
    require_modules("capsuled.processes.terminate", "capsule_client.kit.store")
    rounds = ctx.size(quick=2, full=20)
    home = ctx.scratch("terminate") / "home"
    home.mkdir(mode=0o700)
    calls: list[float] = []
    durations: list[float] = []
    floors: list[float] = []
    with DaemonProcess(home, home.parent / "d.sock", log_level="warning") as daemon:
        with RawClient(daemon.socket_path) as client:
            client.call("sessions.snapshot", {"max_age_ms": 0})
            for number in range(rounds):
                took_s, duration_s = _round(client, home, number)
                calls.append(took_s)
                durations.append(duration_s)
                floors.append(_floor())
    ctx.log(f"16: terminate of {PROCESSES}: p50 {_ms(calls, 50)}, p99 {_ms(calls, 99)}")
    verdicts = [
        report(
            f"terminate of a {PROCESSES}-process session, all exiting on TERM: p50 / p99",
            f"p50 {_ms(calls, 50)}, p99 {_ms(calls, 99)} over {rounds} rounds "
            f"(kill + reap floor p50 {_ms(floors, 50)})",
        ),
    ]
    tables = [
        Table(
            columns=["measured", "rounds", "p50", "p99", "max"],
            rows=[
                [
                    "session.terminate call (client side)",
                    str(rounds),
                    _ms(calls, 50),
                    _ms(calls, 99),
                    f"{max(calls) * 1000:.1f} ms",
                ],
                [
                    "its duration_ms (from the first signal)",
                    str(rounds),
                    _ms(durations, 50),
                    _ms(durations, 99),
                    f"{max(durations) * 1000:.1f} ms",
                ],
                [
                    "floor: os.kill + waitpid of 100 sleeps in the benchmark",
                    str(rounds),
                    _ms(floors, 50),
                    _ms(floors, 99),
                    f"{max(floors) * 1000:.1f} ms",
                ],
            ],
        )
    ]
    notes = [
        f"Each round a new session owns {PROCESSES} fresh `sleep` processes by (pid, start "
        "time) rows; once a fresh snapshot lists them all, `session.terminate` (TERM, "
        "grace 10 s, never reached) is timed at the client. The call includes the fresh "
        "observation before the first signal; `duration_ms` runs from the first signal and "
        "includes the fresh observations during and after the waits (the looks for "
        "descendants that appeared meanwhile). A round whose processes are not all "
        "reported `exited` and dead of TERM fails the scenario.",
        "The floor signals and reaps another pool of the same size from the benchmark "
        "itself, in the same round: what ending the processes costs without the daemon.",
    ]
    return Outcome(tables=tables, verdicts=verdicts, notes=notes)
