"""The process sample: which processes run now, and since when (docs/design.md §3 liveness).

One sample per observation decides liveness for every receipt in it. A
sample maps pid → :class:`~capsuled.processes.identity.Start` (its start
ticks, and the Unix seconds they come to with the boot time read for that
sample); zombies are left out because a zombie is not live. A claim is
matched against it exactly by (boot id, ticks) where it carries them, and by
its start time within a tolerance otherwise (:func:`matches_start`,
docs/design.md §14).

On Linux the sample reads ``/proc/<pid>/stat`` directly, one ``open`` and
one ``read`` per pid, parsed by :mod:`capsule_client.kit.proc`: several times
faster than ``psutil.process_iter`` (docs/benchmark-profiles.md, "Figures
behind the code"), with
identical start times (both compute ``btime + starttime / CLK_TCK``).
Elsewhere psutil is used, its starts without ticks, with its per-pid cache cleared first:
``process_iter`` keeps ``Process`` objects by pid, and after a pid is reused
it would return the old process's ``create_time``.

An observation woken by a change costs O(the change) (docs/design.md §5):
its :class:`PartialSample` reads ``/proc/<pid>/stat`` only for the pids it
is asked about, and not even those whose exit a pidfd watches and has not
reported (they still run: a pidfd names one process for good). The full
sample is for walks and verification.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TypeAlias

import psutil

from capsule_client.kit.proc import NOT_LIVE_STATES, ProcStat, read_stat
from capsuled.common.shortage import is_shortage

from .identity import Clock, Start, claim_matches
from .table import ProcessTable, last_pid

__all__ = [
    "PartialSample",
    "ProcessSample",
    "Start",
    "matches_start",
    "partial_samples",
    "sample_processes",
    "sample_with_table",
    "still_running",
]

#: pid → its start (ticks, and Unix seconds).
ProcessSample: TypeAlias = Mapping[int, Start]


def matches_start(
    sample: ProcessSample,
    pid: int,
    started_at_s: float,
    tolerance_s: float,
    *,
    boot_id: str | None = None,
    start_ticks: int | None = None,
) -> bool:
    """Whether ``pid`` runs in ``sample`` as the process a claim names.

    The claim is a receipt's or a row's: its start time, and where it has
    them its boot id and start ticks, compared exactly when it does and
    within ``tolerance_s`` of ``started_at_s`` when it does not
    (:func:`~capsuled.processes.identity.claim_matches`). A pid missing from
    the sample (no such process, a zombie, a process we may not inspect) is
    not live; neither is a reused pid (docs/design.md §3 liveness, §14).
    """
    start = sample.get(pid)
    return start is not None and claim_matches(
        start, started_at_s, tolerance_s, boot_id, start_ticks
    )


def _sample_proc(stats: dict[int, ProcStat] | None = None) -> dict[int, Start]:
    clock = Clock()
    boot_s, ticks = clock.boot_time_s, clock.ticks_per_s
    sample: dict[int, Start] = {}
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
            # Clock.start(), inlined: this line runs once per process per sample.
            sample[pid] = Start(boot_s + stat.start_ticks / ticks, stat.start_ticks)
            if stats is not None:
                stats[pid] = stat
    return sample


def _sample_psutil() -> dict[int, Start]:
    psutil.process_iter.cache_clear()
    sample: dict[int, Start] = {}
    for process in psutil.process_iter(["create_time", "status"]):
        info = process.info
        if info["create_time"] is None or info["status"] in (None, psutil.STATUS_ZOMBIE):
            continue
        sample[process.pid] = Start(info["create_time"])
    return sample


def _choose_sampler() -> Callable[[], dict[int, Start]]:
    if sys.platform.startswith("linux") and os.path.isdir("/proc/self"):
        return _sample_proc
    return _sample_psutil


_sampler = _choose_sampler()


def sample_processes() -> dict[int, Start]:
    """Take one fresh process sample: pid → start (ticks, Unix seconds), zombies excluded.

    Blocking (reads ``/proc`` or calls psutil); run it in a worker thread.

    Raises:
        OSError: the process table could not be listed at all, or a process
            could not be read for a shortage of the daemon's own
            (:func:`capsuled.common.shortage.is_shortage`): a sample that lost a
            live process would end its receipts' liveness.
    """
    return _sampler()


def sample_with_table() -> tuple[dict[int, Start], ProcessTable | None]:
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


def still_running(held: Mapping[int, tuple[Start, int]]) -> dict[int, Start]:
    """pid → start of the ``held`` processes (pid → (start, pidfd)) whose pidfd is
    not readable now: one ``poll`` of them all. A readable, closed or invalid descriptor
    leaves its pid out (the sample then reads its stat)."""
    if not held:
        return {}
    poller = select.poll()
    for _start, fd in held.values():
        poller.register(fd, select.POLLIN)
    ready = {fd for fd, _events in poller.poll(0)}
    return {pid: start for pid, (start, fd) in held.items() if fd not in ready}


def partial_samples() -> bool:
    """Whether :class:`PartialSample` can read single pids here (Linux ``/proc``)."""
    return _sampler is _sample_proc


class PartialSample(Mapping[int, Start]):
    """A sample read only where it is asked: pid → start, zombies excluded.

    Args:
        running: pid → start of processes known to run now (a pidfd
            watches them and has not reported their exit): answered without
            a stat read, their ticks converted with this sample's boot time
            like every other answer's.

    Any other pid is read from ``/proc/<pid>/stat`` the first time it is
    asked, and the answer kept, so one observation sees one value per pid.
    Iterating lists only what was answered so far. The boot time is read
    once, at the first answer. Linux only (:func:`partial_samples`).
    Blocking: use it in the observation's worker thread.
    """

    __slots__ = ("_answers", "_clock", "_running", "reads")

    def __init__(self, running: Mapping[int, Start]) -> None:
        self._running = running
        self._answers: dict[int, Start | None] = {}
        self._clock: Clock | None = None
        #: Stat files read so far.
        self.reads = 0

    def get(self, pid: int, default: Start | None = None) -> Start | None:  # type: ignore[override]
        if pid in self._answers:
            start = self._answers[pid]
        else:
            held = self._running.get(pid)
            start = self._answers[pid] = self._stat(pid) if held is None else self._now(held)
        return default if start is None else start

    def _now(self, held: Start) -> Start:
        """A held process's start, in this sample's seconds (the boot time read now)."""
        if held.ticks is None:
            return held
        return self._seconds().start(held.ticks)

    def _seconds(self) -> Clock:
        if self._clock is None:
            self._clock = Clock()
        return self._clock

    def _stat(self, pid: int) -> Start | None:
        self.reads += 1
        try:
            stat = read_stat(pid)
        except (OSError, ValueError):  # no such process, hidden from us, or torn
            return None
        if stat.state in NOT_LIVE_STATES:
            return None
        return self._seconds().start(stat.start_ticks)

    def __getitem__(self, pid: int) -> Start:
        start = self.get(pid)
        if start is None:
            raise KeyError(pid)
        return start

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.get(pid) is not None

    def __iter__(self) -> Iterator[int]:
        yield from self._running
        yield from (
            pid
            for pid, start in self._answers.items()
            if start is not None and pid not in self._running
        )

    def __len__(self) -> int:
        answered = sum(
            1
            for pid, start in self._answers.items()
            if start is not None and pid not in self._running
        )
        return len(self._running) + answered

    def answered(self) -> dict[int, Start]:
        """What was answered so far, as a plain mapping (frozen: no later read)."""
        # A running pid is never read; one not asked keeps the start it was given.
        answered = dict(self._running)
        answered.update((pid, start) for pid, start in self._answers.items() if start is not None)
        return answered
