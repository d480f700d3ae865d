"""Linux ``/proc``: the one ``/proc/<pid>/stat`` parser, the boot's time and id, ticks to seconds.

``/proc/<pid>/stat`` is one line; field 2 is the command name in parentheses,
which may itself hold spaces and ``)``, so the fields after it are counted
from the last ``)`` (proc(5)). The fields read here: 3 ``state``, 4 ``ppid``,
6 ``session`` (the session id), 22 ``starttime`` (clock ticks since boot);
and, for the daemon's command lines (:func:`parse_exec_mark`), 2 ``comm``
and 48-49 ``arg_start`` / ``arg_end`` (where the argv lies in the process's
memory, which every ``execve`` lays out anew).

A start time in Unix seconds is ``btime + starttime / CLK_TCK``, ``btime``
being the boot time from ``/proc/stat``: the same arithmetic as psutil's
``create_time()``, so the daemon's sample, the pidfd re-check and the receipt
writer agree to the bit (docs/design.md §3 liveness).

That wall-clock start moves whenever the clock is stepped (NTP, ``date -s``, a
resumed VM): the kernel derives ``btime`` from the wall clock at each read. The
kernel's exact identity of a process is (boot id, start ticks): the boot id
(``/proc/sys/kernel/random/boot_id``, :func:`boot_id`) is new at every boot, and
the ticks are counted from that boot, untouched by any step. Writers record both
beside the start time (:func:`process_start`), and the daemon compares them
exactly where both sides have them (docs/design.md §14).

Receipt writers, the daemon's process sample and its exit watch all read the
stat line through here. Off Linux there is no ``/proc``: the daemon uses psutil,
and :func:`process_start`, the writers' start, asks ``sysctl`` on macOS and
records no boot id or ticks.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Final, NamedTuple

__all__ = [
    "BOOT_ID_PATH",
    "NOT_LIVE_STATES",
    "ExecMark",
    "ProcStat",
    "ProcessStart",
    "boot_id",
    "boot_time_s",
    "is_boot_id",
    "parse_exec_mark",
    "parse_stat",
    "process_start",
    "process_start_time",
    "read_stat",
    "read_stat_line",
    "start_time_s",
    "ticks_per_s",
]

#: ``state`` letters of a process that is not live: zombie, dead (``X``, and ``x`` of old kernels).
NOT_LIVE_STATES: Final = frozenset({"Z", "X", "x"})

#: This boot's id, a random UUID the kernel makes at each boot (random(4)).
BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"

#: Fields after the command name up to ``starttime``: ``starttime`` is the 20th of them.
_START_INDEX: Final = 19
#: ``arg_start`` (field 48) among the fields after the command name.
_ARG_START_INDEX: Final = 45


class ProcStat(NamedTuple):
    """The fields of a ``/proc/<pid>/stat`` line the project reads."""

    #: One letter: ``R`` running, ``S`` sleeping, ``Z`` zombie, ... (proc(5)).
    state: str
    #: The parent's pid (0 for pid 1 and kernel threads' parent).
    ppid: int
    #: The session id (field 6): the pid of the session leader.
    session_id: int
    #: When the process started, clock ticks since boot (field 22).
    start_ticks: int

    @property
    def live(self) -> bool:
        """False for a zombie or a dead process."""
        return self.state not in NOT_LIVE_STATES


def parse_stat(data: bytes) -> ProcStat:
    """The fields of a ``/proc/<pid>/stat`` line.

    Raises:
        ValueError: ``data`` is not a stat line (no ``)``, a field not a number,
            or too few fields).
    """
    fields = data[data.rindex(b")") + 2 :].split(None, _START_INDEX + 1)
    if len(fields) <= _START_INDEX:
        raise ValueError(f"a /proc stat line has more fields than {len(fields)} after the name")
    return ProcStat(fields[0].decode(), int(fields[1]), int(fields[3]), int(fields[_START_INDEX]))


class ExecMark(NamedTuple):
    """What tells one program of a process from the next: read before and after its argv.

    ``arg_start`` and ``arg_end`` are 0 where the kernel hides them (a process
    the reader may not ``ptrace``, a kernel before 3.5); ``comm`` then tells
    most programs apart.
    """

    #: One letter, as in :class:`ProcStat`.
    state: str
    #: When the process started, clock ticks since boot (field 22).
    start_ticks: int
    #: The command name (field 2), at most 15 bytes.
    comm: bytes
    #: Where its argv starts and ends in its memory (fields 48, 49).
    arg_start: int
    arg_end: int

    def same_program(self, later: ExecMark) -> bool:
        """Whether ``later``, read after this one, marks the same program of the same
        process: no exec and no exit between the two reads. The state letter is not
        compared while both are live: a running process sleeps and wakes between
        any two reads."""
        return (
            self.start_ticks == later.start_ticks
            and self.comm == later.comm
            and (self.arg_start, self.arg_end) == (later.arg_start, later.arg_end)
            and (self.state in NOT_LIVE_STATES) == (later.state in NOT_LIVE_STATES)
        )


def parse_exec_mark(data: bytes) -> ExecMark:
    """The :class:`ExecMark` of a ``/proc/<pid>/stat`` line.

    Raises:
        ValueError: ``data`` is not a stat line.
    """
    close = data.rindex(b")")
    comm = data[data.index(b"(") + 1 : close]
    fields = data[close + 2 :].split()
    if len(fields) <= _START_INDEX:
        raise ValueError(f"a /proc stat line has more fields than {len(fields)} after the name")
    arg_start = arg_end = 0
    if len(fields) > _ARG_START_INDEX + 1:
        arg_start, arg_end = int(fields[_ARG_START_INDEX]), int(fields[_ARG_START_INDEX + 1])
    return ExecMark(fields[0].decode(), int(fields[_START_INDEX]), comm, arg_start, arg_end)


def read_stat_line(pid: int) -> bytes:
    """``/proc/<pid>/stat`` as it is, read with one ``read``.

    Raises:
        ProcessLookupError: no process ``pid`` (or no ``/proc``).
        OSError: the file could not be read.
    """
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ProcessLookupError(pid, f"no process {pid}") from None
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def read_stat(pid: int) -> ProcStat:
    """:func:`parse_stat` of ``/proc/<pid>/stat``, read with one ``read``.

    Raises:
        ProcessLookupError: no process ``pid`` (or no ``/proc``).
        OSError: the file could not be read.
        ValueError: what was read is not a stat line.
    """
    return parse_stat(read_stat_line(pid))


def boot_time_s() -> int:
    """``btime`` from ``/proc/stat``: the boot time, whole Unix seconds.

    Read afresh on every call: the kernel derives it from the wall clock, so
    it moves when the clock is stepped.

    Raises:
        OSError: ``/proc/stat`` could not be read or has no ``btime`` line.
    """
    with open("/proc/stat", "rb") as file:
        for line in file:
            if line.startswith(b"btime "):
                return int(line.split()[1])
    raise OSError("/proc/stat has no btime line")


@functools.cache
def ticks_per_s() -> int:
    """``CLK_TCK``: the clock ticks a second that ``starttime`` counts (100 on Linux)."""
    return os.sysconf("SC_CLK_TCK")


def start_time_s(start_ticks: int, boot_s: int, ticks: int) -> float:
    """A ``starttime`` as Unix seconds: ``boot_s + start_ticks / ticks``."""
    return boot_s + start_ticks / ticks


@functools.cache
def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), read once per process.

    None where the OS has none (no ``/proc``: macOS, a sandbox that hides it):
    writers then record no exact identity, and the daemon compares start times
    within a tolerance (docs/design.md §14).
    """
    try:
        with open(BOOT_ID_PATH, "rb") as file:
            text = file.read().decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if is_boot_id(text) else None


_HEX: Final = frozenset("0123456789abcdef")
_DASHES: Final = (8, 13, 18, 23)


def is_boot_id(text: str) -> bool:
    """Whether ``text`` is written as the kernel writes a boot id: a UUID in lowercase hex.

    The daemon compares boot ids as text, so a boot id written otherwise
    (upper case, braces) could never match: receipts refuse it.
    """
    return len(text) == 36 and all(
        (char == "-") if at in _DASHES else (char in _HEX) for at, char in enumerate(text)
    )


# --------------------------------------------------------------------------
# Process start from the OS (no psutil on the client side)


class ProcessStart(NamedTuple):
    """When a process started, as a writer records it (docs/design.md §3, §4, §14).

    ``boot_id`` and ``start_ticks`` go together: both, or neither (off Linux,
    or a start the caller gives as a time alone).
    """

    #: The wall-clock start, Unix seconds: what people are shown.
    started_at_s: float
    #: The boot it started in (:func:`boot_id`); None where unknown.
    boot_id: str | None = None
    #: ``starttime``, clock ticks since that boot (field 22); None where unknown.
    start_ticks: int | None = None


def process_start(pid: int) -> ProcessStart:
    """The start of process ``pid``: its wall-clock time and, on Linux, its exact identity.

    Linux: one read of ``/proc/<pid>/stat`` gives field 22 (clock ticks since
    boot); the wall-clock time is the boot time from ``/proc/stat`` plus those
    ticks, the same arithmetic as psutil's ``create_time()`` and the daemon's
    sample; the boot id comes from :func:`boot_id`. macOS:
    ``sysctl(KERN_PROC_PID)``'s ``p_starttime``, no boot id or ticks.

    Raises:
        ProcessLookupError: no process ``pid``.
        OSError: the platform is neither Linux nor macOS, or the OS refused.
        ValueError: ``/proc/<pid>/stat`` could not be parsed.
    """
    if sys.platform.startswith("linux"):
        stat = read_stat(pid)
        started_at_s = start_time_s(stat.start_ticks, boot_time_s(), ticks_per_s())
        this_boot = boot_id()
        if this_boot is None:
            return ProcessStart(started_at_s)
        return ProcessStart(started_at_s, this_boot, stat.start_ticks)
    if sys.platform == "darwin":
        return ProcessStart(_darwin_start_time(pid))
    raise OSError(f"reading a process start time is not supported on {sys.platform}")


def process_start_time(pid: int) -> float:
    """The start time of process ``pid``, Unix seconds (:func:`process_start`'s wall clock).

    Raises:
        ProcessLookupError: no process ``pid``.
        OSError: the platform is neither Linux nor macOS, or the OS refused.
        ValueError: ``/proc/<pid>/stat`` could not be parsed.
    """
    return process_start(pid).started_at_s


_CTL_KERN = 1
_KERN_PROC = 14
_KERN_PROC_PID = 1
#: sizeof(struct kinfo_proc) on 64-bit macOS; kp_proc.p_starttime is its first member.
_KINFO_PROC_SIZE = 648


def _darwin_start_time(pid: int) -> float:  # pragma: no cover - exercised on macOS only
    import ctypes  # macOS only: Linux reads /proc
    import ctypes.util

    class Timeval(ctypes.Structure):
        _fields_ = (("tv_sec", ctypes.c_int64), ("tv_usec", ctypes.c_int32))

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    mib = (ctypes.c_int * 4)(_CTL_KERN, _KERN_PROC, _KERN_PROC_PID, pid)
    buffer = ctypes.create_string_buffer(_KINFO_PROC_SIZE)
    size = ctypes.c_size_t(_KINFO_PROC_SIZE)
    if libc.sysctl(mib, 4, buffer, ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    if size.value == 0:
        raise ProcessLookupError(pid, f"no process {pid}")
    start = Timeval.from_buffer_copy(buffer.raw[: ctypes.sizeof(Timeval)])
    return float(start.tv_sec) + float(start.tv_usec) / 1_000_000
