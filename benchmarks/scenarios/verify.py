"""Scenario 12: what one verification run costs at 100k receipts, and what it costs amortized.

Verification is the net under the watch: every ``--verify-interval``
(default 30 s) the daemon compares every listed directory and every live
receipt with what it last saw (a ``stat`` each), re-reading only what
differs. Here a daemon runs with a short ``--verify-interval`` on a home of
100k live receipts, then on one of 100 live among 100k stale; once the
first run is over, nothing changes for a window while its CPU time (``utime
+ stime`` of ``/proc/<pid>/stat``) and ``status.verification`` are read at
both ends. CPU per run is the CPU over the window divided by the runs in it
(an idle daemon does nothing else: scenario 9); amortized at the default
interval it is that divided by 30 s.

Baseline in the same run: ``find HOME -printf '%T@\\n' >/dev/null``, which
``stat``s every directory and every file of the home in C.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, report, require_modules
from benchmarks.procstat import cpu_s
from benchmarks.rawclient import RawClient
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import fmt_count, fmt_s

__all__ = ["run"]

DEFAULT_INTERVAL_S = 30.0


def _verification(daemon: DaemonProcess) -> dict[str, Any]:
    with RawClient(daemon.socket_path) as client:
        status: dict[str, Any] = client.call("status")
    result: dict[str, Any] = status["verification"]
    result["observations"] = status["totals"]["observations"]
    return result


def _find_stat(home: Path) -> float:
    started = time.perf_counter()
    subprocess.run(f"find '{home}' -printf '%T@\\n' >/dev/null", shell=True, check=True)
    return time.perf_counter() - started


def _wait_for_runs(daemon: DaemonProcess, runs: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (status := _verification(daemon))["runs"] < runs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no verification run {runs} within {timeout_s} s: {status}")
        time.sleep(0.02)
    return status


def _measure(ctx: Context, live: int, stale: int, interval_s: float) -> list[str]:
    home = ctx.home(live, stale=stale)
    scratch = ctx.scratch(f"verify{live}s{stale}")
    window_s = ctx.size(quick=1.0, full=8.0)
    args = ["--verify-interval", f"{interval_s:g}"]
    with DaemonProcess(home.home, scratch / "d.sock", args, log_level="warning") as daemon:
        with RawClient(daemon.socket_path) as client:
            wait_for_answer(client, live, timeout_s=ctx.size(quick=30.0, full=600.0))
        # The window starts and ends just after a run: whole runs only.
        first = _wait_for_runs(daemon, 1, timeout_s=60.0 + interval_s)
        before = _wait_for_runs(daemon, first["runs"] + 1, timeout_s=60.0 + interval_s)
        cpu_before, started = cpu_s(daemon.pid), time.monotonic()
        time.sleep(window_s)
        now = _verification(daemon)["runs"]
        after = _wait_for_runs(daemon, now + 1, timeout_s=60.0 + interval_s)
        cpu_used, elapsed_s = cpu_s(daemon.pid) - cpu_before, time.monotonic() - started
    runs = after["runs"] - before["runs"]
    per_run_s = cpu_used / runs
    _find_stat(home.home)  # the page cache and the dentry cache are warm for both
    find_s = sorted(_find_stat(home.home) for _ in range(3))[1]
    label = f"{fmt_count(live)} live" + (f", {fmt_count(stale)} stale" if stale else "")
    ctx.log(
        f"12: {label}: {runs} runs, {fmt_s(per_run_s)} CPU each, "
        f"checked {after['last_checked']:,}; find -printf {fmt_s(find_s)}"
    )
    return [
        label,
        f"{fmt_count(after['last_checked'])}",
        f"{runs} in {elapsed_s:.1f} s ({after['observations'] - before['observations']} obs.)",
        fmt_s(per_run_s),
        f"{100 * per_run_s / DEFAULT_INTERVAL_S:.3f} %",
        f"{100 * cpu_used / elapsed_s:.1f} %",
        str(after["changes_found"]),
        fmt_s(find_s),
    ]


def run(ctx: Context) -> Outcome:
    """Both homes in turn: CPU per verification run and its amortized share."""
    require_modules("capsuled.watch.inotify", "capsule_client.kit.receipts")
    interval_s = ctx.size(quick=0.2, full=1.0)
    receipts = ctx.size(quick=1000, full=100_000)
    rows = [
        _measure(ctx, receipts, 0, interval_s),
        _measure(ctx, 100, receipts, interval_s),
    ]
    table = Table(
        columns=[
            "home",
            "checked per run",
            "runs in the window",
            "CPU per run",
            "amortized at 30 s",
            f"CPU at {interval_s:g} s",
            "changes found",
            "find -printf '%T@' (all entries)",
        ],
        rows=rows,
    )
    verdicts = [
        report(
            f"verification run at {receipts // 1000}k receipts: CPU per run",
            f"{rows[0][3]} ({rows[0][0]}), {rows[1][3]} ({rows[1][0]})",
        ),
        report(
            "verification amortized at the default --verify-interval (30 s)",
            f"{rows[0][4]} of a core ({rows[0][0]}), {rows[1][4]} ({rows[1][0]})",
        ),
    ]
    notes = [
        f"The daemon runs with `--verify-interval {interval_s:g}`; the window "
        f"({ctx.size(quick=1.0, full=8.0):g} s or a little more) starts just after a run "
        "(after the first) and ends just after one (found by asking `status` every 20 ms "
        "meanwhile), so it holds whole runs. CPU is `utime + stime` of `/proc/<pid>/stat` "
        "over the window (clock ticks of 10 ms), divided by the runs "
        "`status.verification.runs` counted in it; "
        "'obs.' is how many observations `status.totals.observations` counted meanwhile.",
        "'Checked per run' is `status.verification.last_checked`: listed directories, live "
        "receipts and errored receipts. Amortized: CPU per run / 30 s, as a share of one core.",
        "find: median of 3, after one run that warms the caches; it `stat`s every entry, "
        "stale receipts included, where verification skips them.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
