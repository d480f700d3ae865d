"""Scenario 9: what an idle daemon costs, in CPU and wake-ups, against watchman on the same home.

For each home (empty; 100 live receipts; 100 live among 10k stale; 10k
live; 100 live among 100k stale) watchman is told to watch it (and waits
for its crawl), then a daemon with its default flags starts on it. Once the
daemon's answer is ready and a few seconds have passed, nothing happens for one
window while both are measured side by side from ``/proc``
(:mod:`benchmarks.procstat`): CPU from ``/proc/<pid>/stat`` (``utime +
stime``, clock ticks) and the threads' ``schedstat`` run time, wake-ups as
the context switches of every thread. Then extra ``sleep`` processes bring
the machine to about 600 processes and a second window is measured, the
same daemon and watchman still running; the extras are killed and the next
home follows, with a new daemon.

The window is as long as the daemon's default verification interval (30 s),
so each window holds one verification run, whatever its phase: the idle
figure includes the net under the watch. Where watchman cannot be had, a
bare inotify watch of every directory of the home (a process that does
nothing but block in ``read``) stands in for it, and the notes say so.

Idle with live session processes is judged on the homes of 100 live
receipts (alone and among stale ones); the 10k-live home is measured and
reported, not judged: no home anyone has holds 10k live processes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmarks.daemon import DaemonProcess
from benchmarks.harness import ROOT, Context, Outcome, Table, judge, report, require_modules
from benchmarks.homes import SleepPool
from benchmarks.procstat import IdleFigures, IdleWindow, process_count
from benchmarks.rawclient import RawClient
from benchmarks.scenarios.snapshot import wait_for_answer
from benchmarks.watchman import WatchmanUnavailable

__all__ = ["run"]

#: Homes with no live session process (docs/design.md §8: an idle daemon sleeps).
CPU_TARGET_PERCENT = 0.05
WAKEUPS_TARGET_PER_S = 2.0
#: Homes with live session processes: the descendant looks may add to it.
LIVE_CPU_TARGET_PERCENT = 0.2
LIVE_WAKEUPS_TARGET_PER_S = 3.0
#: The live receipts of the homes the live target is judged on; homes with more are
#: reported (no home anyone has holds 10k live processes).
JUDGED_LIVE = 100
MANY_PROCESSES = 600


class _Watcher(Protocol):
    name: str

    def start(self, home: Path) -> int: ...

    def stop(self, home: Path) -> None: ...


class _Watchman:
    """Watchman watching the home (one server for the whole run)."""

    def __init__(self, ctx: Context) -> None:
        self.server = ctx.watchman()
        self.name = f"watchman {self.server.version}"

    def start(self, home: Path) -> int:
        self.server.watch(home)
        return self.server.pid

    def stop(self, home: Path) -> None:
        self.server.unwatch(home)


class _BareInotify:
    """``python -m benchmarks.inotify_tree HOME``: one inotify watch per directory, nothing else."""

    name = "a bare inotify watch (watchman unavailable)"

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None

    def start(self, home: Path) -> int:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.inotify_tree", str(home)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        if not self.process.stdout.readline():  # the number of directories: it is watching
            raise RuntimeError("the bare inotify watcher did not start")
        return self.process.pid

    def stop(self, home: Path) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


def _watcher(ctx: Context) -> tuple[_Watcher, str | None]:
    try:
        return _Watchman(ctx), None
    except WatchmanUnavailable as exc:
        return _BareInotify(), str(exc)


def _status(daemon: DaemonProcess) -> dict[str, Any]:
    with RawClient(daemon.socket_path) as client:
        status: dict[str, Any] = client.call("status")
    return status


def _homes(ctx: Context) -> list[tuple[str, int, int]]:
    """(label, live, stale) of each home measured.

    A quick run measures one home of each kind, with homes other scenarios have made.
    """
    if ctx.quick:
        return [("empty", 0, 0), ("100 live + 200 stale", JUDGED_LIVE, 200), ("1k live", 1000, 0)]
    return [
        ("empty", 0, 0),
        ("100 live", JUDGED_LIVE, 0),
        ("100 live + 10k stale", JUDGED_LIVE, 10_000),
        ("10k live", 10_000, 0),
        ("100 live + 100k stale", JUDGED_LIVE, 100_000),
    ]


def _home_path(ctx: Context, live: int, stale: int) -> Path:
    if live == 0 and stale == 0:
        home = ctx.scratch("idle-empty-home") / "home"
        home.mkdir(mode=0o700)
        return home
    return ctx.home(live, stale=stale).home


def _cells(figures: IdleFigures) -> list[str]:
    return [
        f"{figures.cpu_percent:.3f} % / {figures.runtime_percent:.3f} %",
        f"{figures.wakeups_per_s:.2f}",
    ]


def _threads(figures: IdleFigures, pid: int) -> str:
    """Wake-ups per second of the main thread and of the others, each with its preempted part."""
    main = sum(n for (tid, _), n in figures.by_thread.items() if tid == pid)
    main_preempted = sum(n for (tid, _), n in figures.preempted_by_thread.items() if tid == pid)
    others, others_preempted = figures.switches - main, figures.preempted - main_preempted
    per_s = figures.seconds
    return (
        f"main thread {main / per_s:.2f}/s ({main_preempted / per_s:.2f} preempted), "
        f"{figures.threads - 1} other thread(s) {others / per_s:.2f}/s "
        f"({others_preempted / per_s:.2f} preempted)"
    )


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    live: int
    processes: int
    ours: IdleFigures
    base: IdleFigures
    counts: str

    def cells(self) -> list[str]:
        return [
            self.label,
            str(self.processes),
            *_cells(self.ours),
            *_cells(self.base),
            self.counts,
        ]


def _window_s(ctx: Context) -> float:
    """The length of one window: the default verification interval (a full run)."""
    return ctx.size(quick=0.5, full=30.0)


def _window(
    ctx: Context, daemon: DaemonProcess, watcher_pid: int, label: str, live: int, many: bool
) -> tuple[_Row, str]:
    window_s = _window_s(ctx)
    extras = SleepPool(max(0, MANY_PROCESSES - process_count()), exited=False) if many else None
    try:
        time.sleep(ctx.size(quick=0.2, full=2.0))
        before = _status(daemon)
        time.sleep(ctx.size(quick=0.1, full=1.0))  # the status connection is over
        processes = process_count()
        figures = IdleWindow({"daemon": daemon.pid, "watcher": watcher_pid}).measure(window_s)
        after = _status(daemon)
    finally:
        if extras is not None:
            extras.close()
    ours, base = figures["daemon"], figures["watcher"]
    observations = after["totals"]["observations"] - before["totals"]["observations"]
    verifications = after["totals"]["verifications"] - before["totals"]["verifications"]
    row = _Row(label, live, processes, ours, base, f"{observations} / {verifications}")
    ctx.log(
        f"9: {label}, {processes} processes: daemon {ours.cpu_percent:.3f} % "
        f"({ours.runtime_percent:.3f} %), {ours.wakeups_per_s:.2f}/s; watcher "
        f"{base.cpu_percent:.3f} %, {base.wakeups_per_s:.2f}/s"
    )
    return row, _threads(ours, daemon.pid)


def _worst(rows: list[_Row], value: Callable[[_Row], float]) -> _Row:
    return max(rows, key=value)


def run(ctx: Context) -> Outcome:
    """Each home in turn: one daemon, two idle windows (about 100 and about 600 processes)."""
    require_modules("capsuled.watch.inotify", "capsule_client.kit.receipts")
    watcher, unavailable = _watcher(ctx)
    rows: list[_Row] = []
    threads: dict[str, str] = {}
    exit_watch = "?"
    for label, live, stale in _homes(ctx):
        home = _home_path(ctx, live, stale)
        watcher_pid = watcher.start(home)
        try:
            scratch = ctx.scratch(f"idle-{label.replace(' ', '')}")
            with DaemonProcess(home, scratch / "d.sock", log_level="warning") as daemon:
                with RawClient(daemon.socket_path) as client:
                    wait_for_answer(client, live, timeout_s=ctx.size(quick=30.0, full=600.0))
                exit_watch = str(_status(daemon).get("exit_watch"))
                time.sleep(ctx.size(quick=0.3, full=3.0))  # the start-up's tail
                for many in (False, True):
                    row, by_thread = _window(ctx, daemon, watcher_pid, label, live, many)
                    rows.append(row)
                    threads[f"{label}, {row.processes} processes"] = by_thread
        finally:
            watcher.stop(home)
    base_cpu = _worst(rows, lambda r: r.base.cpu_percent)
    base_wake = _worst(rows, lambda r: r.base.wakeups_per_s)
    verdicts = []
    for what, kept, cpu_target, wake_target in (
        (
            "no live session process",
            [r for r in rows if not r.live],
            CPU_TARGET_PERCENT,
            WAKEUPS_TARGET_PER_S,
        ),
        (
            f"{JUDGED_LIVE} live receipts (alone and among stale ones)",
            [r for r in rows if r.live == JUDGED_LIVE],
            LIVE_CPU_TARGET_PERCENT,
            LIVE_WAKEUPS_TARGET_PER_S,
        ),
    ):
        if not kept:
            continue
        cpu_worst = _worst(kept, lambda r: r.ours.cpu_percent)
        wake_worst = _worst(kept, lambda r: r.ours.wakeups_per_s)
        verdicts += [
            judge(
                f"idle CPU <= {cpu_target:g} % of a core, {what}",
                f"{cpu_worst.ours.cpu_percent:.3f} % at {cpu_worst.label}, "
                f"{cpu_worst.processes} processes (highest)",
                all(r.ours.cpu_percent <= cpu_target for r in kept),
            ),
            judge(
                f"idle wake-ups <= {wake_target:g}/s, {what}",
                f"{wake_worst.ours.wakeups_per_s:.2f}/s at {wake_worst.label}, "
                f"{wake_worst.processes} processes (highest)",
                all(r.ours.wakeups_per_s <= wake_target for r in kept),
            ),
        ]
    for label in dict.fromkeys(r.label for r in rows if r.live > JUDGED_LIVE):
        kept = [r for r in rows if r.label == label]
        cpu_worst = _worst(kept, lambda r: r.ours.cpu_percent)
        wake_worst = _worst(kept, lambda r: r.ours.wakeups_per_s)
        verdicts.append(
            report(
                f"idle CPU and wake-ups at {label} receipts: no target",
                f"highest {cpu_worst.ours.cpu_percent:.3f} % of a core ({cpu_worst.processes} "
                f"processes), {wake_worst.ours.wakeups_per_s:.2f} wake-ups/s "
                f"({wake_worst.processes} processes)",
            )
        )
    verdicts += [
        report(
            "the baseline watching the same home in the same windows",
            f"{watcher.name}: highest {base_cpu.base.cpu_percent:.3f} % of a core "
            f"({base_cpu.label}), {base_wake.base.wakeups_per_s:.2f} wake-ups/s "
            f"({base_wake.label})",
        ),
    ]
    table = Table(
        columns=[
            "home",
            "processes",
            "daemon CPU: ticks / schedstat",
            "daemon wake-ups/s",
            "baseline CPU: ticks / schedstat",
            "baseline wake-ups/s",
            "daemon observations / verifications",
        ],
        rows=[r.cells() for r in rows],
    )
    window_s = _window_s(ctx)
    notes = [
        f"Baseline: {watcher.name}, watching the same home (its crawl finished before the "
        "daemon started), measured in the same windows."
        + (f" Watchman was not used: {unavailable}." if unavailable else ""),
        f"Each window is {window_s:g} s of nothing happening, measured after the daemon's "
        "answer was ready and a pause; the daemon runs with its default flags "
        f"(`--verify-interval` 30 s: a {window_s:g} s window holds about one verification "
        f"run; exit watch: {exit_watch}).",
        f"Idle with live session processes is judged on the homes of {JUDGED_LIVE} live "
        "receipts, alone and among stale ones; the home of more live receipts is measured "
        "and reported, not judged: no home anyone has holds that many live processes.",
        "CPU, percent of one core: `utime + stime` of `/proc/<pid>/stat` (clock ticks of "
        "10 ms, so one tick in a 30 s window is 0.033 %) / the sum of the threads' "
        "`/proc/<pid>/task/*/schedstat` run times (nanoseconds). Wake-ups: "
        "`voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every thread "
        "(`/proc/<pid>/task/*/status`), read every second so that threads that exit "
        "meanwhile are counted up to their last reading.",
        "The second window of each home runs with extra `sleep` processes started to bring "
        f"the machine to about {MANY_PROCESSES} processes (other work on the machine makes "
        "the first row's count what it is).",
        "The daemon's wake-ups by thread ('preempted': the nonvoluntary switches, when the "
        "thread was running and the kernel ran something else): "
        + "; ".join(f"{where}: {text}" for where, text in threads.items())
        + ".",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
