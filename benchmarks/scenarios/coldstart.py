"""Scenario 13: a daemon's cold start to its first complete ``ready`` answer, at 100k receipts.

Each trial starts ``python -m capsuled`` on the shared home of 100k live
receipts and times, from just before the process is spawned, until a
``sessions.snapshot`` answer is ``ready`` and lists every receipt (the
request is sent as soon as the socket answers ``ping``, and waits for the
first observation). ``status`` is asked right after that answer:
``totals.rescans`` must be 1, the watch having started before the first
walk so that the walk needs no second one to catch up. The daemon is then
stopped.

Baseline in the same run, alternating with the daemon's trials:
``find HOME -name '*.json' -exec cat {} + >/dev/null`` (page cache warm for
both, from one run of each first).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import Context, Outcome, Table, judge, require_modules
from benchmarks.rawclient import RawClient
from benchmarks.scenarios.scan import find_cat
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.stats import fmt_count, fmt_ratio, fmt_s

__all__ = ["run"]

TARGET_RATIO = 1.5


def _cold_start(ctx: Context, trial: int, receipts: int) -> tuple[float, float, dict[str, Any]]:
    """Seconds to the first ``ping`` answer and to the first complete ``ready``; ``status`` then."""
    home = ctx.home(receipts).home
    scratch = ctx.scratch(f"coldstart{trial}")
    daemon = DaemonProcess(home, scratch / "d.sock", log_level="warning")
    started = time.perf_counter()
    try:
        daemon.start(timeout_s=ctx.size(quick=30.0, full=600.0))
        ping_s = time.perf_counter() - started
        with RawClient(daemon.socket_path) as client:
            wait_for_answer(client, receipts, timeout_s=ctx.size(quick=30.0, full=600.0))
            ready_s = time.perf_counter() - started
            status: dict[str, Any] = client.call("status")
    finally:
        daemon.stop()
    return ping_s, ready_s, status


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def run(ctx: Context) -> Outcome:
    """Alternate find + cat and the daemon's cold start; judge one walk and the ratio."""
    require_modules("capsuled.watch.inotify", "capsule_client.kit.receipts")
    receipts = ctx.size(quick=1000, full=100_000)
    trials = ctx.size(quick=1, full=3)
    home = ctx.home(receipts).home
    find_cat(home)  # warm the page cache
    _cold_start(ctx, 0, receipts)  # and the daemon's own files
    finds: list[float] = []
    pings: list[float] = []
    readies: list[float] = []
    rescans: list[int] = []
    observations: list[int] = []
    for trial in range(1, trials + 1):
        finds.append(find_cat(home))
        ping_s, ready_s, status = _cold_start(ctx, trial, receipts)
        pings.append(ping_s)
        readies.append(ready_s)
        rescans.append(int(status["totals"]["rescans"]))
        observations.append(int(status["totals"]["observations"]))
        ctx.log(
            f"13: trial {trial}: ready in {fmt_s(ready_s)} (ping {fmt_s(ping_s)}), "
            f"rescans {rescans[-1]}; find+cat {fmt_s(finds[-1])}"
        )
    ready_s, find_s = _median(readies), _median(finds)
    ratio = ready_s / find_s
    table = Table(
        columns=[
            "receipts",
            "spawn -> first ping answered",
            "spawn -> first complete ready",
            "find + cat",
            "ready / find",
            "walks (totals.rescans) at ready",
            "observations at ready",
        ],
        rows=[
            [
                fmt_count(receipts),
                fmt_s(_median(pings)),
                fmt_s(ready_s),
                fmt_s(find_s),
                fmt_ratio(ratio),
                ", ".join(str(n) for n in rescans),
                ", ".join(str(n) for n in observations),
            ]
        ],
    )
    verdicts = [
        judge(
            "cold start: one walk to the first ready (status.totals.rescans == 1)",
            f"rescans {', '.join(str(n) for n in rescans)} in {trials} trial(s)",
            all(n == 1 for n in rescans),
        ),
        judge(
            "cold start to the first complete ready <= 1.5x find + cat",
            f"{fmt_ratio(ratio)} ({fmt_s(ready_s)} against {fmt_s(find_s)})",
            ratio <= TARGET_RATIO,
        ),
    ]
    notes = [
        f"Median of {trials} trial(s), after one untimed start of each (page cache warm); "
        "the daemon runs with its default flags and `--log-level warning`.",
        "Timed from just before `Popen` (interpreter start-up and imports included) to the "
        "first `sessions.snapshot` reply that is `ready` and lists every receipt's process; "
        "the socket is polled every 10 ms until it answers `ping`.",
        "find + cat lists the home and reads every receipt; it checks no process and "
        "answers nobody.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
