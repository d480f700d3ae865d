"""What each process is: its argv read from the OS, once per (pid, start) (docs/design.md §5).

:class:`ArgvCache` reads the argv of listed processes for the answers that
ask ``commands: true``, and keeps it while the process lives:

* On Linux the argv is ``/proc/<pid>/cmdline`` (NUL-separated), read between
  two reads of the stat line; elsewhere ``psutil.Process.cmdline``. A stat
  line that names another process than the listed one (a reused pid: other
  start ticks than the answer's observation sampled, or, where those are not
  known, a start time not within :data:`START_TOLERANCE_S` of the listed
  one), a zombie, an empty ``cmdline`` (kernel threads, a zombie, a process
  that cleared it) or one the OS refuses: ``None``, "the OS does not say".
* Bytes that are not UTF-8 are written ``\\xNN`` (Python's
  ``backslashreplace``, as ``ps`` shows what it cannot print escaped), so the
  answer is valid JSON and a byte is never silently lost.
* At most :data:`MAX_ARGV_BYTES` in all (each string's UTF-8 bytes and one
  separator between two, as the kernel keeps them); a longer argv keeps its
  first strings whole, cuts the one that does not fit at a character and
  ends it with ``"…"``, and drops the rest.
* Kept per (pid, listed start time), the process named by its start ticks
  from then on, so a clock step changes nothing (docs/design.md §14). Each
  use re-reads the stat line at most
  every :data:`RECHECK_S` (every time when ``fresh``) and reads the argv again
  only when its :class:`~capsule_client.kit.proc.ExecMark` moved: a process that
  ``exec``\\ s shows its new command at the next check. Entries of processes
  no longer listed are dropped (:meth:`ArgvCache.read` with ``prune``).

Blocking (``/proc`` reads): run :meth:`ArgvCache.read` in a worker thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

import psutil

from capsule_client.kit.proc import NOT_LIVE_STATES, ExecMark, parse_exec_mark, read_stat_line

from .descendants import ROOT_TOLERANCE_S
from .identity import Clock, Start

__all__ = ["ELLIPSIS", "MAX_ARGV_BYTES", "RECHECK_S", "Argv", "ArgvCache", "argv_of", "cut_argv"]

#: The most bytes of argv an answer carries per process (docs/design.md §5).
MAX_ARGV_BYTES: Final = 4096
#: What ends an argv that was cut.
ELLIPSIS: Final = "…"
#: Seconds between two checks of one process for an ``exec``, unless asked fresh.
RECHECK_S: Final = 1.0
#: Without start ticks, a stat line's start time must be this close to the listed
#: one (a root's tolerance, the receipts' widest, plus the listed value's rounding).
START_TOLERANCE_S: Final = ROOT_TOLERANCE_S + 1.0

#: A process's argv, or None where the OS does not say.
Argv: TypeAlias = list[str] | None
#: A listed process: (pid, started_at as listed, Unix seconds).
Key: TypeAlias = tuple[int, int]

_LINUX: Final = sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def cut_argv(args: list[str]) -> list[str]:
    """``args`` within :data:`MAX_ARGV_BYTES` (UTF-8 bytes, a separator between two).

    The strings that fit are kept whole; the first one that does not is cut
    at a character so that it and a final :data:`ELLIPSIS` fit; the rest are
    dropped.
    """
    sizes = [len(arg.encode()) for arg in args]
    if sum(sizes) + len(args) - 1 <= MAX_ARGV_BYTES:
        return args
    mark = len(ELLIPSIS.encode())
    budget = (
        MAX_ARGV_BYTES - mark - 1
    )  # what is kept whole leaves room for a separator and the mark
    kept: list[str] = []
    used = 0
    for arg, size in zip(args, sizes, strict=True):
        separator = 1 if kept else 0
        if used + separator + size > budget:
            room = MAX_ARGV_BYTES - mark - used - separator
            kept.append(arg.encode()[:room].decode(errors="ignore") + ELLIPSIS)
            break
        kept.append(arg)
        used += separator + size
    return kept


def decode_cmdline(data: bytes) -> Argv:
    """The argv of a ``/proc/<pid>/cmdline`` read (``data`` may be cut short), or None if empty."""
    if not data:
        return None
    if data.endswith(b"\0"):
        data = data[:-1]
    return cut_argv([part.decode("utf-8", "backslashreplace") for part in data.split(b"\0")])


def _read_cmdline(pid: int) -> bytes:
    """Up to one byte more than :data:`MAX_ARGV_BYTES` of ``/proc/<pid>/cmdline``."""
    wanted = MAX_ARGV_BYTES + 1
    fd = os.open(f"/proc/{pid}/cmdline", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while wanted > 0 and (chunk := os.read(fd, wanted)):
            chunks.append(chunk)
            wanted -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _mark(pid: int) -> ExecMark | None:
    try:
        return parse_exec_mark(read_stat_line(pid))
    except (OSError, ValueError):
        return None


def _argv_linux(
    pid: int, started_at: int, clock: Clock, start_ticks: int | None = None
) -> tuple[Argv, ExecMark | None]:
    """The argv of ``pid`` if it is the process listed as started at ``started_at``
    (whose start ticks are ``start_ticks`` where known), and the mark it was read
    under (None: nothing to keep)."""
    before = _mark(pid)
    for _ in range(2):  # an exec between the two stat reads: once more
        if (
            before is None
            or before.state in NOT_LIVE_STATES
            or (
                before.start_ticks != start_ticks
                if start_ticks is not None
                else abs(clock.seconds(before.start_ticks) - started_at) > START_TOLERANCE_S
            )
        ):
            return None, before if before is not None and before.state in NOT_LIVE_STATES else None
        try:
            data = _read_cmdline(pid)
        except OSError:  # gone, or refused (hidepid, a sandbox)
            return None, None
        after = _mark(pid)
        if after is not None and before.same_program(after):
            return decode_cmdline(data), after
        before = after
    return None, None


def _argv_psutil(pid: int, started_at: int) -> Argv:
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - started_at) > START_TOLERANCE_S:
            return None
        return cut_argv(process.cmdline()) or None
    except psutil.Error:
        return None


def argv_of(pid: int, started_at: int, start_ticks: int | None = None) -> Argv:
    """The argv of the process ``pid`` listed as started at ``started_at`` (Unix s;
    exactly the one whose start ticks are ``start_ticks`` where given), read now,
    or None where the OS does not say (docs/design.md §5). Blocking."""
    if _LINUX:
        return _argv_linux(pid, started_at, Clock(), start_ticks)[0]
    return _argv_psutil(pid, started_at)


@dataclass(slots=True)
class _Entry:
    argv: Argv
    mark: ExecMark | None  # None off Linux: read again at each check
    checked_at: float  # monotonic


class ArgvCache:
    """The argv of listed processes, read once per (pid, listed start) and checked for exec.

    Args:
        starts: an answer's ``observed_at`` → pid → the start its observation's
            sample read (the daemon's
            :meth:`~capsuled.discovery.home_reader.HomeReader.sampled_starts`):
            a listed process is first read only if its stat has those start
            ticks. Without it (or for an observation no longer kept) the listed
            start time is compared within :data:`START_TOLERANCE_S`.
    """

    def __init__(self, starts: Callable[[float], Mapping[int, Start]] | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}
        self._starts = starts
        #: argv reads since start (for tests and benchmarks: the cache's hits cost none).
        self.reads = 0

    def ticks_at(self, observed_at: float) -> dict[int, int]:
        """pid → start ticks of the processes of the answer observed at ``observed_at``,
        as its sample read them (empty where not known)."""
        if self._starts is None:
            return {}
        starts = self._starts(observed_at)
        return {pid: start.ticks for pid, start in starts.items() if start.ticks is not None}

    def read(
        self,
        keys: Iterable[Key],
        *,
        fresh: bool = False,
        prune: bool = False,
        ticks: Mapping[int, int] | None = None,
    ) -> dict[Key, Argv]:
        """``(pid, started_at)`` → argv (or None) for each of ``keys``.

        Args:
            keys: the listed processes.
            fresh: check every one for an ``exec`` now (else at most every
                :data:`RECHECK_S`).
            prune: ``keys`` is every listed process: forget the others.
            ticks: pid → the start ticks the listing's sample read: a process
                read for the first time must have exactly these.

        Blocking; run it in a worker thread.
        """
        now = time.monotonic()
        with self._lock:
            clock: Clock | None = None
            entries = self._entries
            kept: dict[Key, _Entry] = {} if prune else entries
            found: dict[Key, Argv] = {}
            for key in keys:
                entry = entries.get(key)
                if entry is None or fresh or now - entry.checked_at >= RECHECK_S:
                    if _LINUX and clock is None:
                        clock = Clock()
                    entry = self._check(key, entry, clock, now, (ticks or {}).get(key[0]))
                kept[key] = entry
                found[key] = entry.argv
            self._entries = kept
            return found

    def cached(self, keys: Iterable[Key]) -> dict[Key, Argv] | None:
        """What :meth:`read` would answer without ``fresh``, if it needs no read now;
        else None. Reads nothing and takes no lock: safe on the event loop."""
        now = time.monotonic()
        entries = self._entries  # lookups only: read() replaces entries, never edits one
        found: dict[Key, Argv] = {}
        for key in keys:
            entry = entries.get(key)
            if entry is None or now - entry.checked_at >= RECHECK_S:
                return None
            found[key] = entry.argv
        return found

    def _check(
        self,
        key: Key,
        entry: _Entry | None,
        clock: Clock | None,
        now: float,
        start_ticks: int | None,
    ) -> _Entry:
        pid, started_at = key
        if clock is None:  # no /proc: psutil
            self.reads += 1
            return _Entry(_argv_psutil(pid, started_at), None, now)
        if entry is not None and entry.mark is not None:
            mark = _mark(pid)
            if mark is not None and entry.mark.same_program(mark):
                return _Entry(entry.argv, entry.mark, now)
            start_ticks = entry.mark.start_ticks  # the process it was first read as, for good
        self.reads += 1
        argv, mark = _argv_linux(pid, started_at, clock, start_ticks)
        return _Entry(argv, mark, now)
