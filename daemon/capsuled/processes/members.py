"""The session processes during a descendants look, and the pidfds that say which exited
(docs/design.md §5, descendants).

A :class:`Member` is a session process as a look knows it: its start ticks
(what names it, docs/design.md §14), the start time it is listed with, its
Unix session, its session and root, its parent. :class:`ExitPoll` holds
a pidfd per member, all polled in one ``poll`` call: a held process needs no
stat read at a look, since its descriptor turns readable when it exits.
"""

from __future__ import annotations

import os
import select
import weakref
from dataclasses import dataclass

from capsuled.common.shortage import is_shortage

from .table import proc_stat

__all__ = ["ExitPoll", "Member"]


@dataclass(frozen=True, slots=True)
class Member:
    """A session process during a look."""

    start_ticks: int
    sid: int
    session_id: str
    root_pid: int
    parent_pid: int  # 0 for a root
    #: The start time it is listed with, Unix seconds: a root's as its receipt or
    #: row says; a descendant's as read when first seen, kept while it lives (a
    #: clock step moves no listed process).
    started_at: int = 0


class ExitPoll:
    """A pidfd per session process, all polled in one syscall: which have exited.

    A pidfd names one process for good, so a held process needs no stat read
    at a look: its descriptor turns readable when it exits. Past
    ``max_pidfds`` (or without pidfds) processes are checked by their stat.
    """

    def __init__(self, max_pidfds: int) -> None:
        self.max_pidfds = max_pidfds if hasattr(os, "pidfd_open") else 0
        self._held: dict[int, tuple[int, int]] = {}  # pid → (fd, start ticks)
        self._poll = select.poll()
        self._finalizer = weakref.finalize(self, _close_all, self._held)

    def holds(self, pid: int, start_ticks: int) -> bool:
        """Whether a pidfd is held for ``pid`` as the process that started at ``start_ticks``."""
        held = self._held.get(pid)
        return held is not None and held[1] == start_ticks

    def exited(self) -> set[int]:
        """The held pids whose process has exited (or is a zombie)."""
        if not self._held:
            return set()
        ready = {fd for fd, _ in self._poll.poll(0)}
        return {pid for pid, (fd, _) in self._held.items() if fd in ready}

    def sync(self, members: dict[int, Member]) -> int:
        """Hold exactly ``members``; a new one whose pid turns out reused since its stat
        was read is dropped from ``members``. Returns the stat files read."""
        for pid, (_fd, start_ticks) in list(self._held.items()):
            member = members.get(pid)
            if member is None or member.start_ticks != start_ticks:
                self._release(pid)
        reads = 0
        for pid, member in list(members.items()):
            if pid in self._held or len(self._held) >= self.max_pidfds:
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                del members[pid]
                continue
            except OSError as exc:
                if not is_shortage(exc):  # refused for good (a sandbox): stat reads
                    self.max_pidfds = len(self._held)
                break  # short of descriptors: stat reads for the rest, this time
            reads += 1
            stat = proc_stat(pid)  # the pid may have been reused before the open
            if stat is None or not stat.live or stat.start_ticks != member.start_ticks:
                os.close(fd)
                del members[pid]
                continue
            self._held[pid] = (fd, member.start_ticks)
            self._poll.register(fd, select.POLLIN)
        return reads

    def _release(self, pid: int) -> None:
        fd, _ = self._held.pop(pid)
        self._poll.unregister(fd)
        os.close(fd)

    def close(self) -> None:
        """Close every pidfd (garbage collection does too)."""
        self._finalizer()


def _close_all(held: dict[int, tuple[int, int]]) -> None:
    for fd, _ in held.values():
        os.close(fd)
    held.clear()
