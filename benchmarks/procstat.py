"""What a process costs while it waits: CPU time and wake-ups, from ``/proc`` (Linux).

* **CPU**: ``utime + stime`` of ``/proc/<pid>/stat``, the whole process
  (every thread, live or exited), in clock ticks (10 ms at ``USER_HZ`` 100).
  Beside it, each thread's ``/proc/<pid>/task/<tid>/schedstat`` run time in
  nanoseconds, summed: finer, but a thread that exits between two readings
  takes its last part with it.
* **Wake-ups**: each thread's ``voluntary_ctxt_switches +
  nonvoluntary_ctxt_switches`` from ``/proc/<pid>/task/<tid>/status``. A
  thread that sleeps, wakes and sleeps again adds one switch: so the sum over
  the threads is the number of times the process was woken (and preempted).

Threads come and go (a worker pool's thread retires after a while), so
:class:`IdleWindow` reads every thread at its start, once a second, and at
its end, and counts each thread from its first reading (from zero for a
thread born meanwhile) to its last.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["IdleFigures", "IdleWindow", "ThreadReading", "cpu_s", "process_count", "read_threads"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """``utime + stime`` of the whole process ``pid``, seconds (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def process_count() -> int:
    """Processes on the machine now (the numeric entries of ``/proc``)."""
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


@dataclass(frozen=True, slots=True)
class ThreadReading:
    """One thread's counters at one moment.

    Attributes:
        name: its ``comm``.
        switches: voluntary and nonvoluntary context switches.
        preempted: of which nonvoluntary (it was running and something else ran).
        runtime_ns: its ``schedstat`` run time (0 where the kernel has none).
    """

    name: str
    switches: int
    preempted: int
    runtime_ns: int


def _read_thread(task: str) -> ThreadReading | None:
    try:
        with open(f"{task}/comm", encoding="utf-8", errors="replace") as comm:
            name = comm.read().strip()
        switches = preempted = 0
        with open(f"{task}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches"):
                    switches += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    preempted += int(line.split()[1])
        switches += preempted
        runtime_ns = 0
        try:
            with open(f"{task}/schedstat", encoding="ascii") as schedstat:
                runtime_ns = int(schedstat.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # no schedstat in this kernel: the tick figure stands alone
    except OSError:
        return None  # the thread exited meanwhile
    return ThreadReading(name, switches, preempted, runtime_ns)


def read_threads(pid: int) -> dict[int, ThreadReading]:
    """Every thread of ``pid`` now, by thread id."""
    readings: dict[int, ThreadReading] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return readings
    for tid in tids:
        reading = _read_thread(f"/proc/{pid}/task/{tid}")
        if reading is not None:
            readings[int(tid)] = reading
    return readings


@dataclass(frozen=True, slots=True)
class IdleFigures:
    """What one process cost over one window.

    Attributes:
        seconds: the window's wall time.
        cpu_s: ``utime + stime`` over it (clock ticks).
        runtime_s: the threads' ``schedstat`` run time over it (nanosecond
            counters; a thread's part after its last reading is missing).
        switches: context switches of every thread over it.
        preempted: of which nonvoluntary.
        by_thread: switches per thread, ``(tid, name)``: the main thread's
            tid is the pid.
        preempted_by_thread: nonvoluntary switches per thread, the same keys.
        threads: threads seen.
    """

    seconds: float
    cpu_s: float
    runtime_s: float
    switches: int
    preempted: int
    by_thread: Mapping[tuple[int, str], int]
    preempted_by_thread: Mapping[tuple[int, str], int]
    threads: int

    @property
    def cpu_percent(self) -> float:
        """CPU (ticks) as a percentage of one core."""
        return 100 * self.cpu_s / self.seconds

    @property
    def runtime_percent(self) -> float:
        """CPU (schedstat) as a percentage of one core."""
        return 100 * self.runtime_s / self.seconds

    @property
    def wakeups_per_s(self) -> float:
        """Context switches of all threads per second."""
        return self.switches / self.seconds


@dataclass
class _Tracked:
    pid: int
    cpu_s: float
    first: dict[int, ThreadReading]
    last: dict[int, ThreadReading] = field(default_factory=dict)

    def read(self) -> None:
        for tid, reading in read_threads(self.pid).items():
            self.last[tid] = reading

    def figures(self, seconds: float) -> IdleFigures:
        by_thread: dict[tuple[int, str], int] = {}
        preempted: dict[tuple[int, str], int] = {}
        runtime_ns = 0
        for tid, last in self.last.items():
            first = self.first.get(tid)
            key = (tid, last.name)
            by_thread[key] = last.switches - (first.switches if first else 0)
            preempted[key] = last.preempted - (first.preempted if first else 0)
            runtime_ns += last.runtime_ns - (first.runtime_ns if first else 0)
        return IdleFigures(
            seconds=seconds,
            cpu_s=cpu_s(self.pid) - self.cpu_s,
            runtime_s=runtime_ns / 1e9,
            switches=sum(by_thread.values()),
            preempted=sum(preempted.values()),
            by_thread=by_thread,
            preempted_by_thread=preempted,
            threads=len(by_thread),
        )


class IdleWindow:
    """Measure several processes over the same window of wall time.

    Reading ``/proc`` does not wake the processes read.

    Args:
        pids: the processes, by the name the figures are returned under.
    """

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._pids = dict(pids)

    def measure(self, seconds: float, *, read_every_s: float = 1.0) -> dict[str, IdleFigures]:
        """Sleep ``seconds`` while reading every thread every ``read_every_s``; the figures."""
        tracked = {
            name: _Tracked(pid, cpu_s(pid), read_threads(pid)) for name, pid in self._pids.items()
        }
        started = time.monotonic()
        for one in tracked.values():
            one.last = dict(one.first)
        end = started + seconds
        while (now := time.monotonic()) < end:
            time.sleep(min(read_every_s, end - now))
            for one in tracked.values():
                one.read()
        elapsed_s = time.monotonic() - started
        return {name: one.figures(elapsed_s) for name, one in tracked.items()}
