"""``session.terminate``'s signalling: pidfds, a grace period, then ``SIGKILL`` (docs/design.md §7).

:func:`terminate` takes the processes a fresh observation listed for a
session and ends them:

1. each is opened as a pidfd (``os.pidfd_open``) and its start read
   again; a process that has exited, is a zombie, or whose pid now names a
   process that started at another time (other start ticks, the observation's
   sample's: a clock step changes nothing, docs/design.md §14) is ``gone``
   and gets nothing. From
   then on every signal goes through the pidfd
   (``signal.pidfd_send_signal``), so a pid reused after the check is never
   signalled. Where no pidfd can be had (no ``pidfd_open``, a kernel before
   5.3, the descriptor table full), the start time is read again
   immediately before each ``os.kill`` instead;
2. pid 1, the daemon and the daemon's parent are never signalled
   (``refused``), nor is a process we may not signal (``EPERM``:
   ``refused``, with the error), nor one the caller spares (``spared``:
   its pid, and its start time within :data:`START_TOLERANCE_S` of the
   listed or the sampled one; docs/design.md §7, §11);
3. the others get ``signal`` and have ``grace_s`` to exit; exits are pidfd
   readability (``anyio.wait_readable``), not polling. While they have, the
   ``more`` callable is asked every :data:`DISCOVER_INTERVAL_S` for
   descendants that appeared since (a shell's trap starting a clean-up, a
   supervisor restarting a child): they are signalled too;
4. what is left at the end of the grace gets ``SIGKILL`` (unless ``signal``
   was ``KILL``), and then :data:`KILL_WAIT_S` to go.

Every step is a non-blocking syscall or a ``/proc`` read of a few
microseconds, so it runs on the event loop. Only the fallback without
pidfds waits by polling (every :data:`FALLBACK_POLL_INTERVAL_S`).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio
import structlog
from anyio.abc import TaskGroup
from msgspec import UNSET, UnsetType

from capsule_client.kit.proc import read_stat
from capsule_client.wire import (
    DEFAULT_GRACE_MS,
    ProcessKind,
    TerminatedProcess,
    TerminateOutcome,
    TerminateReport,
    TerminateSignal,
)
from capsuled.common.shortage import is_shortage, shortage_gap

from .table import Clock

__all__ = [
    "DISCOVER_INTERVAL_S",
    "FALLBACK_POLL_INTERVAL_S",
    "KILL_WAIT_S",
    "SIGNALS",
    "START_TOLERANCE_S",
    "MoreTargets",
    "Spared",
    "Target",
    "protected_pids",
    "terminate",
]

log = structlog.get_logger("capsuled.terminate")

SIGNALS: Final[dict[TerminateSignal, signal.Signals]] = {
    "TERM": signal.SIGTERM,
    "INT": signal.SIGINT,
    "HUP": signal.SIGHUP,
    "KILL": signal.SIGKILL,
}

#: Without start ticks, the start time read before signalling must be this close to the
#: observed one (boot-time jitter of the epoch conversion, as in ``capsuled.processes.exits``).
START_TOLERANCE_S: Final = 1.0
#: Seconds between two questions for new descendants during the grace.
DISCOVER_INTERVAL_S: Final = 0.1
#: Seconds given to processes after ``SIGKILL`` (one in uninterruptible sleep may take longer).
KILL_WAIT_S: Final = 2.0
#: Seconds between two looks at a process held without a pidfd.
FALLBACK_POLL_INTERVAL_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class Target:
    """A process of the session, as the observation listed it.

    Attributes:
        pid: its pid.
        started_at: its start time as listed, Unix seconds (echoed in the report).
        kind: as listed (``provider_client``, ``exec``, ``process``, ``descendant``).
        start_s: the start time the observation's sample read, Unix seconds;
            None: ``started_at``. Compared within :data:`START_TOLERANCE_S`
            where ``start_ticks`` is None.
        parent_pid: a descendant's parent, as listed (echoed in the report).
        root_pid: a descendant's root, as listed (echoed in the report).
        command: its argv, read before its first signal, when asked
            (``commands: true``; echoed in the report).
        start_ticks: the start ticks the observation's sample read: when
            given, the process is the one whose stat has exactly these.
    """

    pid: int
    started_at: int
    kind: ProcessKind
    start_s: float | None = None
    parent_pid: int | UnsetType = UNSET
    root_pid: int | UnsetType = UNSET
    command: list[str] | UnsetType | None = UNSET
    start_ticks: int | None = None


#: Asked during the grace: the session's processes now (new ones are signalled too).
MoreTargets = Callable[[], Awaitable[Iterable[Target]]]

#: The processes the caller spares: (pid, start time in Unix seconds) pairs.
Spared = Iterable[tuple[int, int]]


def _is_spared(target: Target, spared: dict[int, list[int]]) -> bool:
    """Whether the caller spared ``target``: its pid, and a start time within
    :data:`START_TOLERANCE_S` of the one listed or the one the sample read."""
    starts: tuple[float, ...] = (target.started_at,)
    if target.start_s is not None:
        starts += (target.start_s,)
    return any(
        abs(start - given) <= START_TOLERANCE_S
        for given in spared.get(target.pid, ())
        for start in starts
    )


def protected_pids() -> frozenset[int]:
    """Pids never signalled: init, the daemon itself and its parent."""
    return frozenset({1, os.getpid(), os.getppid()})


@dataclass(eq=False, slots=True)
class _Victim:
    target: Target
    fd: int | None = None
    outcome: TerminateOutcome | None = None  # set once decided
    error: str | None = None
    signalled: bool = False  # a signal was delivered
    killed: bool = False  # SIGKILL was delivered
    exited: anyio.Event = field(default_factory=anyio.Event)

    @property
    def running(self) -> bool:
        """Signalled (or about to be) and not known to have exited."""
        return self.outcome is None and not self.exited.is_set()

    def report(self) -> TerminatedProcess:
        target = self.target
        outcome = self.outcome or ("killed" if self.killed else "exited")
        return TerminatedProcess(
            target.pid,
            target.started_at,
            target.kind,
            outcome,
            error=UNSET if self.error is None else self.error,
            parent_pid=target.parent_pid,
            root_pid=target.root_pid,
            command=target.command,
        )


class _Run:
    """One call of :func:`terminate`: its processes, their waiters, the clock."""

    def __init__(
        self, tg: TaskGroup, signum: signal.Signals, pidfds: bool, clock: Clock, spared: Spared
    ) -> None:
        self.tg = tg
        self.signum = signum
        self.clock = clock
        self.protected = protected_pids()
        self.spared: dict[int, list[int]] = {}
        for pid, started_at in spared:
            self.spared.setdefault(pid, []).append(started_at)
        self.victims: list[_Victim] = []
        self.latest: dict[int, _Victim] = {}  # pid → its latest victim (a pid may be reused)
        supported = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
        self.use_pidfds = pidfds and supported

    def running(self) -> list[_Victim]:
        return [victim for victim in self.victims if victim.running]

    def add(self, targets: Iterable[Target], signum: signal.Signals) -> None:
        """Open, check and signal the targets not seen before."""
        for target in targets:
            seen = self.latest.get(target.pid)
            if seen is not None and (seen.target.started_at == target.started_at or seen.running):
                continue  # the same process (listed again, or its start time read differently)
            victim = self.latest[target.pid] = _Victim(target)
            self.victims.append(victim)
            if _is_spared(target, self.spared):
                victim.outcome = "spared"
                continue
            self._open(victim)
            if victim.outcome is None:
                self.send(victim, signum)
            if victim.outcome is None:
                self.tg.start_soon(self._wait, victim)

    def _same_process(self, target: Target) -> bool:
        """Whether ``target`` still runs under its pid (its start time read again).

        Raises:
            OSError: the daemon is short of descriptors or memory
                (:func:`capsuled.common.shortage.is_shortage`): nothing is known of it.
        """
        try:
            stat = read_stat(target.pid)
        except OSError as exc:
            if is_shortage(exc):
                raise
            return False  # gone, or hidden from us
        except ValueError:
            return False
        if not stat.live:
            return False
        if target.start_ticks is not None:
            return stat.start_ticks == target.start_ticks
        expected = target.started_at if target.start_s is None else target.start_s
        return abs(self.clock.seconds(stat.start_ticks) - expected) <= START_TOLERANCE_S

    def _open(self, victim: _Victim) -> None:
        pid = victim.target.pid
        if pid <= 1 or pid in self.protected:
            victim.outcome = "refused"
            victim.error = f"pid {pid} is init, the daemon or its parent: never signalled"
            return
        if self.use_pidfds:
            try:
                victim.fd = os.pidfd_open(pid)
            except ProcessLookupError:
                victim.outcome = "gone"
                return
            except OSError as exc:  # ENOSYS, EMFILE, a sandbox: kill(2) after a re-check
                log.debug("no pidfd; signalling by pid", pid=pid, error=str(exc))
        # With a pidfd open, this check names the process the fd holds for good.
        try:
            if not self._same_process(victim.target):
                victim.outcome = "gone"
        except OSError as exc:  # the daemon's shortage: neither gone nor safe to signal
            _refused_short(victim, exc)

    def send(self, victim: _Victim, signum: signal.Signals) -> None:
        """Signal one victim; a failure decides its outcome."""
        try:
            if victim.fd is not None:
                signal.pidfd_send_signal(victim.fd, signum)
            elif self._same_process(victim.target):
                os.kill(victim.target.pid, signum)
            else:
                raise ProcessLookupError(errno.ESRCH, "exited or reused")
        except ProcessLookupError:  # exited since the check (or, without a pidfd, reused)
            if not victim.signalled:
                victim.outcome = "gone"
            victim.exited.set()
            return
        except PermissionError as exc:
            victim.outcome = "refused"
            victim.error = f"not permitted to signal pid {victim.target.pid}: {exc.strerror}"
            return
        except OSError as exc:  # the re-check before kill(2) was short of descriptors
            if not is_shortage(exc):
                raise
            if not victim.signalled:
                _refused_short(victim, exc)
            return
        victim.signalled = True
        if signum == signal.SIGKILL:
            victim.killed = True

    async def _wait(self, victim: _Victim) -> None:
        if victim.fd is not None:
            try:
                await anyio.wait_readable(victim.fd)
            except anyio.ClosedResourceError:
                return
        else:  # no pidfd: nothing to wait on but the process table
            while True:
                try:
                    if not self._same_process(victim.target):
                        break
                except OSError:  # short of descriptors: as far as is known, it runs
                    pass
                await anyio.sleep(FALLBACK_POLL_INTERVAL_S)
        victim.exited.set()

    async def wait_all(self, deadline: float, more: MoreTargets | None) -> None:
        """Until every victim has exited or the monotonic ``deadline`` passes; ``more``
        is asked at the start and every :data:`DISCOVER_INTERVAL_S` (also once all exited)."""
        while True:
            if more is not None:
                self.add(await more(), self.signum)
            running = self.running()
            remaining = deadline - time.monotonic()
            if not running or remaining <= 0:
                return
            with anyio.move_on_after(
                remaining if more is None else min(DISCOVER_INTERVAL_S, remaining)
            ):
                for victim in running:
                    await victim.exited.wait()

    def close(self) -> None:
        for victim in self.victims:
            if victim.fd is not None:
                anyio.notify_closing(victim.fd)
                os.close(victim.fd)
                victim.fd = None


async def terminate(
    session_id: str,
    targets: Sequence[Target],
    *,
    signal_name: TerminateSignal = "TERM",
    grace_s: float = DEFAULT_GRACE_MS / 1000,
    more: MoreTargets | None = None,
    pidfds: bool = True,
    spare: Spared = (),
) -> TerminateReport:
    """Signal ``targets``, wait up to ``grace_s``, ``SIGKILL`` the rest; report each outcome.

    Args:
        session_id: echoed in the report and the log.
        targets: the session's live processes from a fresh observation.
        signal_name: the first signal (docs/design.md §7: ``TERM``, ``INT``, ``HUP``, ``KILL``).
        grace_s: seconds the processes have to exit before ``SIGKILL``.
        more: asked during the grace for the session's processes now; those
            not in ``targets`` are signalled too (and reported).
        pidfds: False signals with ``kill(2)`` after a start-time check, as
            where no pidfd can be had (for tests).
        spare: (pid, start time) of processes not to signal, found in
            ``targets`` or in what ``more`` lists: they are reported ``spared``.

    Returns:
        The report, processes sorted by pid (outcomes as in
        :class:`capsule_client.wire.TerminatedProcess`); a process whose
        start time the daemon was too short of descriptors to read again is
        ``refused``, never signalled blindly nor called ``gone``.

    Raises:
        OSError: the boot time could not be read (the daemon is short of
            descriptors, :func:`capsuled.common.shortage.is_shortage`): nothing was signalled.
    """
    signum = SIGNALS[signal_name]
    started = time.monotonic()
    clock = Clock()  # before anything is signalled: every check needs it
    async with anyio.create_task_group() as tg:
        run = _Run(tg, signum, pidfds, clock, spare)
        try:
            run.add(targets, signum)
            if signum != signal.SIGKILL:
                await run.wait_all(started + grace_s, more)
            if more is not None:  # what was started at the last moment gets no grace
                run.add(await more(), signal.SIGKILL)
            for victim in run.running():
                if not victim.killed:
                    run.send(victim, signal.SIGKILL)
            await run.wait_all(time.monotonic() + KILL_WAIT_S, None)
            for victim in run.running():
                victim.error = f"still running {KILL_WAIT_S:g} s after SIGKILL"
            duration_ms = round((time.monotonic() - started) * 1000)
        finally:
            tg.cancel_scope.cancel()
            run.close()
    processes = sorted((v.report() for v in run.victims), key=lambda p: p.pid)
    counts = {outcome: 0 for outcome in ("exited", "killed", "gone", "refused", "spared")}
    for process in processes:
        counts[process.outcome] += 1
    log.info(
        "session terminated",
        session_id=session_id,
        signal=signal_name,
        processes=len(processes),
        duration_ms=duration_ms,
        **counts,
    )
    return TerminateReport(session_id=session_id, processes=processes, duration_ms=duration_ms)


def _refused_short(victim: _Victim, exc: OSError) -> None:
    """Not signalled: the daemon could not read whether the pid is still the process."""
    victim.outcome = "refused"
    victim.error = f"not signalled: {shortage_gap(exc.errno, retrying=False)}"
