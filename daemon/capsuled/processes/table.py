"""The process table as descendants and terminate read it: stat lines, the pid counter, Tgid.

The stat line is parsed by the project's one parser (``capsule_client.kit.proc``);
ticks become Unix seconds through :class:`~capsuled.processes.identity.Clock`
(named here too). This module adds what descendants and terminate need on top of it: a lookup
that answers None for a gone process (:func:`proc_stat`), a full table with
the pid counter read before it (:func:`take_table`), and thread detection.
Linux only: elsewhere every function answers "nothing" (None, empty).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from capsule_client.kit.proc import ProcStat, read_stat

from .identity import Clock

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


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat fields, or None if there is no such process (or it cannot be read)."""
    try:
        return read_stat(pid)
    except (OSError, ValueError):
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
