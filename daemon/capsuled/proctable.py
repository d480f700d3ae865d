"""The process table as descendants and terminate read it: ``/proc/<pid>/stat`` with ppid and sid.

One small parser (:func:`proc_stat`) and a full table (:func:`sample_table`).
To fold into the one ``/proc/<pid>/stat`` parser of ``capsule_client._proc``
once it exists; until then this is the only copy the two modules use.
Linux only: elsewhere every function answers "nothing" (None, empty).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from capsule_client.receipts import linux_boot_time

__all__ = [
    "Clock",
    "ProcStat",
    "ProcessTable",
    "last_pid",
    "proc_stat",
    "sample_table",
    "take_table",
    "thread_group_id",
]

#: ``/proc/<pid>/stat`` states that are not live: zombie, dead.
NOT_LIVE_STATES = frozenset({"Z", "X", "x"})


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` that descendants and terminate use.

    Attributes:
        state: the state letter (``Z`` for a zombie).
        ppid: the parent's pid (1, or a subreaper, once re-parented).
        sid: the Unix session id (the pid of the session's leader).
        start_ticks: the start time, clock ticks since boot (exact: the pair
            (pid, start_ticks) names one process for good).
    """

    state: str
    ppid: int
    sid: int
    start_ticks: int

    @property
    def live(self) -> bool:
        """False for a zombie or a dead process."""
        return self.state not in NOT_LIVE_STATES


class Clock:
    """Converts start ticks to Unix seconds (boot time + ticks / ``SC_CLK_TCK``).

    Read once per look: ``btime`` may move by a second between two reads
    (docs/design.md §3 liveness tolerances).
    """

    def __init__(self) -> None:
        self.boot_time_s = linux_boot_time()
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")

    def seconds(self, start_ticks: int) -> float:
        """The start time in Unix seconds."""
        return self.boot_time_s + start_ticks / self.ticks_per_s


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat fields, or None if there is no such process (or it cannot be read)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        # The command (field 2) is in parentheses and may contain ")": count from the last one.
        fields = data[data.rindex(b")") + 2 :].split()
        return ProcStat(fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[19]))
    except (ValueError, IndexError):
        return None


def thread_group_id(pid: int) -> int | None:
    """The ``Tgid`` of ``pid`` from ``/proc/<pid>/status``: ``pid`` itself unless it is a
    thread (whose stat a probe by number reads too); None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def sample_table() -> dict[int, ProcStat]:
    """Every live process (zombies left out): pid → stat. Blocking: O(all processes)."""
    table: dict[int, ProcStat] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat.live:
                table[int(name)] = stat
    return table


def last_pid() -> int | None:
    """The pid most recently handed out in this pid namespace (``/proc/loadavg``'s last
    field), or None where it cannot be read. Threads take pids from the same counter."""
    try:
        with open("/proc/loadavg", "rb") as file:
            return int(file.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """A full table and the pid counter read just before it (:func:`take_table`).

    Attributes:
        last_pid: :func:`last_pid` before the listing: every process with a
            pid handed out up to it is in ``stats`` (or had exited).
        stats: pid → stat of every live process.
    """

    last_pid: int | None
    stats: dict[int, ProcStat]


def take_table() -> ProcessTable:
    """A full table with its pid counter. Blocking: O(all processes)."""
    counter = last_pid()
    return ProcessTable(counter, sample_table())
