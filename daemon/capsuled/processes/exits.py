"""Process exits as events: one pidfd per watched process (Linux >= 5.3).

Liveness is decided from a process sample (docs/design.md §3), and the sampler takes
one every ``--sample-interval``. Without help, a process that exits leaves the
answer only at the next sample. :class:`ExitWatch` holds a pidfd
(``os.pidfd_open``) for every process the latest answer rests on — live
candidates' pids, the store's processes that matched the sample, live
servers (:attr:`capsuled.reader.Observation.watched`) — and calls
``on_exit`` the moment one becomes readable, that is when the process exits
(it fires while the process is a zombie, for non-children too, with no
privilege needed, on Linux 5.3+). Discovery then observes again at once,
so the answer changes within milliseconds.

The pid-reuse race: the sample says pid P started at S; by the time the
pidfd is opened, P may have exited and been reused. So after opening, the
start is read again from ``/proc/<pid>/stat``; if its start ticks are not
S's, the process we meant is gone: the descriptor is closed and ``on_exit``
called. A pid that no longer exists at all is an exit too. The ticks, not
the wall-clock start time, name the process (docs/design.md §14): a clock
step between the sample and the re-check, or between two samples of a held
process, changes nothing here. (Without ticks, off Linux, the start times
are compared within :data:`RECHECK_TOLERANCE_S`; no pidfd is opened there.)

Fallback to sampling, where exits are noticed only by the next sample:

* no ``os.pidfd_open`` (macOS, other systems) or the kernel refuses it
  (Linux < 5.3): :attr:`ExitWatch.mode` is ``sampling`` for good. (On macOS
  ``kqueue`` with ``NOTE_EXIT`` could do the same; it is not implemented.)
* more watched processes than ``max_pidfds`` (``--max-pidfds``, default
  4096, lowered to the pidfds' share of the open-file limit at start,
  :mod:`capsuled.service.budget`), or the daemon is short of descriptors
  (:func:`capsuled.common.shortage.is_shortage`): the processes past the limit are
  left to sampling, :attr:`ExitWatch.unwatched` counts them, and
  :attr:`ExitWatch.mode` says ``sampling`` (docs/design.md §8).

Everything here runs on the event loop: ``pidfd_open`` and one ``/proc``
read cost a few microseconds per new process, and only new processes are
opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio
import structlog

from capsule_client.kit.proc import NOT_LIVE_STATES, read_stat
from capsule_client.wire import ExitWatchMode
from capsuled.common.shortage import is_shortage
from capsuled.common.tasks import TaskHost

from .identity import Clock, Start

__all__ = ["DEFAULT_MAX_PIDFDS", "RECHECK_TOLERANCE_S", "ExitWatch", "pidfds_supported"]

log = structlog.get_logger("capsuled.exits")

#: Descriptors held at most, unless configured otherwise (``--max-pidfds``).
DEFAULT_MAX_PIDFDS: Final = 4096

#: Without start ticks, the start time read after ``pidfd_open`` must be this close to the sample's.
RECHECK_TOLERANCE_S: Final = 1.0


def pidfds_supported() -> bool:
    """Whether this system can open a pidfd (tries one on the daemon itself)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None or not os.path.isdir("/proc/self"):
        return False
    try:
        fd = pidfd_open(os.getpid())
    except OSError:  # ENOSYS before Linux 5.3, or refused by a sandbox
        return False
    os.close(fd)
    return True


def _start_time(pid: int) -> Start | None:
    """The start of ``pid`` from ``/proc``; None if it is gone or a zombie.

    Raises:
        OSError: the daemon is short of descriptors or memory
            (:func:`capsuled.common.shortage.is_shortage`): the process may well run.
    """
    try:
        stat = read_stat(pid)
        clock = Clock()
    except OSError as exc:
        if is_shortage(exc):
            raise
        return None
    except ValueError:
        return None
    if stat.state in NOT_LIVE_STATES:
        return None
    return clock.start(stat.start_ticks)


@dataclass(eq=False, slots=True)
class _Watch:
    pid: int
    start: Start
    fd: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class ExitWatch(TaskHost):
    """Holds a pidfd per watched process and reports exits.

    Args:
        on_exit: called (on the event loop) when a watched process exits, or
            turns out to be gone when its pidfd is opened.
        max_pidfds: descriptors held at most; processes past it are left to sampling.
        enabled: False forces sampling (for tests and systems without pidfds);
            None decides by :func:`pidfds_supported`.
    """

    def __init__(
        self,
        on_exit: Callable[[], None],
        *,
        max_pidfds: int = DEFAULT_MAX_PIDFDS,
        enabled: bool | None = None,
    ) -> None:
        self._on_exit = on_exit
        self.max_pidfds = max_pidfds
        self._enabled = pidfds_supported() if enabled is None else enabled
        self._watches: dict[int, _Watch] = {}
        super().__init__()
        self._table_full = False
        self._warned_short = False  # once per shortage, not at every observation
        # (pid, start's key) the re-check found gone; reported once, not again
        # while samples keep listing it (a start read differently each time
        # would otherwise wake discovery in a loop).
        self._refused: set[tuple[int, int | float]] = set()
        self.unwatched = 0

    @property
    def mode(self) -> ExitWatchMode:
        """``pidfd`` when every watched process's exit is an event, ``sampling`` when
        samples notice some (no pidfds here, or :attr:`unwatched` past the limit)."""
        return "pidfd" if self._enabled and not self.unwatched else "sampling"

    @property
    def supported(self) -> bool:
        """Whether pidfds are used at all on this system."""
        return self._enabled

    @property
    def held(self) -> int:
        """Descriptors held now."""
        return len(self._watches)

    def holding(self) -> dict[int, tuple[Start, int]]:
        """pid → (start; its pidfd) of every process watched now: while its pidfd is
        not readable it runs (a pidfd names one process for good; see
        :func:`capsuled.processes.sample.still_running`). Empty when exits are sampled."""
        return {pid: (watch.start, watch.fd) for pid, watch in self._watches.items()}

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status``."""
        if not self._enabled:
            return ["process exits are noticed by sampling only (no pidfd on this system)"]
        if self._table_full:
            return [
                f"{self.unwatched} watched processes have no pidfd: the daemon is out of"
                " file descriptors; their exits are noticed by sampling"
            ]
        if self.unwatched:
            return [
                f"{self.unwatched} watched processes are past the {self.max_pidfds} pidfd limit"
                " (or the descriptor table is full); their exits are noticed by sampling"
            ]
        return []

    def _stopped(self) -> None:
        """The waiters have ended: every descriptor is closed."""
        for watch in list(self._watches.values()):
            self._close(watch)

    def track(self, watched: Mapping[int, Start]) -> None:
        """Hold a pidfd for exactly the processes in ``watched`` (pid → start).

        Processes no longer listed are let go; new ones are opened and
        re-checked; a pid that names another process now (other start ticks)
        is re-opened. A held process whose start time moved with the clock
        keeps its pidfd.
        """
        if not self._enabled or self._tg is None:
            self.unwatched = len(watched)  # every exit is left to sampling
            return
        for pid, watch in list(self._watches.items()):
            start = watched.get(pid)
            if start is None or not start.same(watch.start, RECHECK_TOLERANCE_S):
                self._close(watch)
        self._table_full = False
        unwatched = 0
        exited = False
        refused = set()
        for pid in sorted(watched):
            if pid in self._watches:
                continue
            key = (pid, watched[pid].key)
            if key in self._refused:  # reported once already: the sample still says it runs
                refused.add(key)
                unwatched += 1
                continue
            if len(self._watches) >= self.max_pidfds or self._table_full:
                unwatched += 1
                continue
            opened = self._open(pid, watched[pid])
            if opened is None:  # short of descriptors: this one and the rest are sampled
                unwatched += 1
            elif not opened:
                exited = True
                refused.add(key)
        self._refused = refused
        self.unwatched = unwatched
        if not self._table_full:
            self._warned_short = False
        if exited:
            self._exited()

    def _open(self, pid: int, sampled: Start) -> bool | None:
        """Open and re-check one pidfd; False if the process turned out to be gone,
        None if the daemon is short of descriptors (nothing is known of the process)."""
        assert self._tg is not None
        try:
            fd = os.pidfd_open(pid)
            try:
                now = _start_time(pid)
            except OSError:
                os.close(fd)
                raise
        except ProcessLookupError:
            return False
        except OSError as exc:
            if not is_shortage(exc):
                raise
            if not self._warned_short:
                log.warning("cannot open more pidfds; sampling notices the rest", error=str(exc))
            self._warned_short = self._table_full = True
            return None
        if now is None or not now.same(sampled, RECHECK_TOLERANCE_S):
            os.close(fd)  # exited, or the pid was reused since the sample
            return False
        watch = _Watch(pid, sampled, fd)
        self._watches[pid] = watch
        self._tg.start_soon(self._wait, watch)
        return True

    async def _wait(self, watch: _Watch) -> None:
        with watch.scope:
            try:
                await anyio.wait_readable(watch.fd)
            except anyio.ClosedResourceError:
                return
            self._close(watch)
            self._exited()

    def _exited(self) -> None:
        self._on_exit()

    def _close(self, watch: _Watch) -> None:
        if self._watches.get(watch.pid) is not watch:
            return
        del self._watches[watch.pid]
        watch.scope.cancel()
        anyio.notify_closing(watch.fd)
        os.close(watch.fd)
