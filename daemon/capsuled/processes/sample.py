"""The process sample: which processes run now, and since when (docs/design.md §3 liveness).

One sample per observation decides liveness for every receipt in it. A
sample maps pid → start time (Unix seconds, float); zombies are left out
because a zombie is not live.

On Linux the sample reads ``/proc/<pid>/stat`` directly, one ``open`` and
one ``read`` per pid, parsed by :mod:`capsule_client._proc`: several times
faster than ``psutil.process_iter`` (docs/benchmark-profiles.md, "Figures
behind the code"), with
identical start times (both compute ``btime + starttime / CLK_TCK``).
Elsewhere psutil is used, with its per-pid cache cleared first:
``process_iter`` keeps ``Process`` objects by pid, and after a pid is reused
it returned the old process's ``create_time`` (seen on this project).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

import psutil

from capsule_client._proc import NOT_LIVE_STATES, ProcStat, boot_time_s, read_stat, ticks_per_s
from capsuled.common.shortage import is_shortage

from .table import ProcessTable, last_pid

__all__ = [
    "ProcessSample",
    "UsageMeter",
    "matches_start",
    "sample_processes",
    "sample_with_table",
]

#: pid → start time, Unix seconds.
ProcessSample: TypeAlias = Mapping[int, float]


def matches_start(sample: ProcessSample, pid: int, started_at_s: float, tolerance_s: float) -> bool:
    """Whether ``pid`` runs in ``sample`` and started within ``tolerance_s`` of ``started_at_s``.

    A pid missing from the sample (no such process, a zombie, a process we
    may not inspect) is not live; neither is a reused pid whose start time
    differs (docs/design.md §3 liveness).
    """
    start = sample.get(pid)
    return start is not None and abs(start - started_at_s) <= tolerance_s


def _sample_proc(stats: dict[int, ProcStat] | None = None) -> dict[int, float]:
    boot_s = boot_time_s()
    ticks = ticks_per_s()
    sample: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            stat = read_stat(pid)
        except OSError as exc:  # exited since the listing, or hidden from us
            if is_shortage(exc):  # the daemon's trouble: the process may well run
                raise
            continue
        except ValueError:  # torn
            continue
        if stat.state not in NOT_LIVE_STATES:
            # start_time_s(), inlined: this line runs once per process per sample.
            sample[pid] = boot_s + stat.start_ticks / ticks
            if stats is not None:
                stats[pid] = stat
    return sample


def _sample_psutil() -> dict[int, float]:
    psutil.process_iter.cache_clear()
    sample: dict[int, float] = {}
    for process in psutil.process_iter(["create_time", "status"]):
        info = process.info
        if info["create_time"] is None or info["status"] in (None, psutil.STATUS_ZOMBIE):
            continue
        sample[process.pid] = info["create_time"]
    return sample


def _choose_sampler() -> Callable[[], dict[int, float]]:
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return _sample_proc
    return _sample_psutil


_sampler = _choose_sampler()


def sample_processes() -> dict[int, float]:
    """Take one fresh process sample: pid → start time (Unix seconds), zombies excluded.

    Blocking (reads ``/proc`` or calls psutil); run it in a worker thread.

    Raises:
        OSError: the process table could not be listed at all, or a process
            could not be read for a shortage of the daemon's own
            (:func:`capsuled.common.shortage.is_shortage`): a sample that lost a
            live process would end its receipts' liveness.
    """
    return _sampler()


def sample_with_table() -> tuple[dict[int, float], ProcessTable | None]:
    """:func:`sample_processes` and, from the same ``/proc`` pass, the full process
    table the descendants tracker walks (ppid, sid; :mod:`capsuled.processes.table`).

    The table is None where the sample does not read ``/proc`` (psutil).
    Blocking; run it in a worker thread.

    Raises:
        OSError: the process table could not be listed at all.
    """
    if _sampler is not _sample_proc:
        return _sampler(), None
    counter = last_pid()  # before the listing: every pid up to it is in the table
    stats: dict[int, ProcStat] = {}
    return _sample_proc(stats), ProcessTable(counter, stats)


class UsageMeter:
    """CPU and memory of listed processes, measured with psutil (``usage: true``).

    ``cpu_percent`` is the CPU time used since this meter last measured the
    same process, over the wall time between (100 = one core busy), as
    ``psutil.Process.cpu_percent(interval=None)`` computes it; the first
    measurement of a process is 0.0. ``Process`` objects are kept per
    (pid, start time), so a reused pid starts afresh, and only for processes
    measured in the latest call, so the meter does not grow.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: dict[tuple[int, int], psutil.Process] = {}

    def measure(self, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], tuple[float, int]]:
        """``(pid, started_at)`` → ``(cpu_percent, rss_bytes)`` for those still running.

        Blocking (psutil reads ``/proc``); run it in a worker thread.
        """
        with self._lock:
            kept: dict[tuple[int, int], psutil.Process] = {}
            usage: dict[tuple[int, int], tuple[float, int]] = {}
            for key in keys:
                process = self._processes.get(key)
                try:
                    if process is None:
                        process = psutil.Process(key[0])
                    with process.oneshot():
                        cpu = process.cpu_percent(interval=None)
                        rss = process.memory_info().rss
                except psutil.Error:
                    continue
                kept[key] = process
                usage[key] = (round(cpu, 1), rss)
            self._processes = kept
            return usage
