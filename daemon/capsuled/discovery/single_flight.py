"""Single flight: one observation at a time, shared by every request that may use it.

A request that arrives while an observation runs waits for it and shares
its result; a request that gives up does not cancel it. A request shares a
running observation only if that observation began no longer than its
``max_age_ms`` before it arrived: otherwise (always with ``max_age_ms: 0``)
it waits for the next one, which every request waiting so shares
(docs/design.md §5, §7).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import anyio
import structlog
from anyio.abc import TaskGroup

from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.errors import InternalError, ShuttingDown
from capsuled.reader import GAP_HOME_REPLACED, ObservationCancelled

__all__ = ["Flight", "NotInTime", "SingleFlight", "Wanted"]

log = structlog.get_logger("capsuled.discovery")

#: Pause between two attempts of an observation that answered ``scanning``.
_RETRY_PAUSE_S: Final = 0.005


class Flight:
    """One running observation and whoever waits for it.

    Attributes:
        number: observations begun before it, plus one; 0 until it begins.
        started_at: when it began (monotonic seconds): on the event loop, just
            before its worker thread takes the changes and the process sample,
            so it reads everything written before a request that arrived
            earlier.
    """

    def __init__(self) -> None:
        self.number = 0
        self.started_at = math.inf
        self.done = anyio.Event()
        self.snapshot: ActiveSessionsSnapshot | None = None
        self.error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class Wanted:
    """Which running observation a request may share (docs/design.md §7 ``max_age_ms``).

    One that began after the request arrived always serves; one that began
    earlier serves only if its start is younger than ``max_age_s`` at the
    request's arrival. So ``max_age_ms: 0`` never shares an observation that
    was already running: it waits for the next one (and shares that one with
    every other request that waits for it).
    """

    begun: int  # observations begun before the request arrived (a flight not begun serves)
    arrived_at: float  # monotonic
    max_age_s: float
    #: Monotonic: a flight begun before it never serves (a change heard then, see
    #: :attr:`capsuled.discovery.wakeups.Wakeups.stale_since`).
    begun_after: float = -math.inf

    def accepts(self, flight: Flight) -> bool:
        young = flight.number > self.begun or self.arrived_at - flight.started_at < self.max_age_s
        return young and flight.started_at >= self.begun_after


class NotInTime(Exception):
    """The request's deadline passed while it waited for an observation."""


class SingleFlight:
    """Runs ``run`` (one observation) at most once at a time, in :attr:`task_group`.

    Args:
        run: one observation; its answer is every sharer's. Called on the
            event loop once the flight is numbered.
        refused: whether new observations are refused (the daemon stops).

    Attributes:
        task_group: where observations run; None while not serving (refused).
        begun: observations begun so far.
    """

    def __init__(
        self,
        run: Callable[[], Awaitable[ActiveSessionsSnapshot]],
        refused: Callable[[], bool],
    ) -> None:
        self._run = run
        self._refused = refused
        self._flight: Flight | None = None
        self.task_group: TaskGroup | None = None
        self.begun = 0

    def wanted(
        self, arrived_at: float, max_age_s: float, *, begun_after: float | None = None
    ) -> Wanted:
        """What a request that arrived at ``arrived_at`` (monotonic) accepts; with
        ``begun_after``, only a flight begun at or after it (monotonic)."""
        after = -math.inf if begun_after is None else begun_after
        return Wanted(self.begun, arrived_at, max_age_s, after)

    async def observe(
        self, wanted: Wanted | None = None, *, deadline: float = math.inf
    ) -> ActiveSessionsSnapshot:
        """One observation, shared with every caller that asks while it runs.

        Args:
            wanted: which running observation the caller may share; a running
                one it does not accept is waited out, and the next one shared.
                None: any.
            deadline: monotonic time after which the caller stops waiting (the
                observation goes on for whoever else shares it).

        Raises:
            ShuttingDown: the daemon is stopping (or no task group is set).
            InternalError: the observation failed on a defect (logged with its traceback).
            NotInTime: ``deadline`` passed first.
        """
        while True:
            flight = self._flight
            if flight is None:
                if self.task_group is None or self._refused():
                    raise ShuttingDown("shutting down: sessions are no longer observed")
                flight = self._flight = Flight()
                self.task_group.start_soon(self._fly, flight)
            with anyio.move_on_after(deadline - time.monotonic()):
                await flight.done.wait()
            if not flight.done.is_set():
                raise NotInTime
            if wanted is None or wanted.accepts(flight):
                break
        if flight.snapshot is not None:
            return flight.snapshot
        if flight.error is None or isinstance(flight.error, ObservationCancelled):
            raise ShuttingDown("shutting down: the observation was cancelled")
        raise InternalError(f"observation failed: {flight.error!r}") from flight.error

    async def settle(
        self, deadline: float, wanted: Wanted | None = None, *, wait: bool = False
    ) -> ActiveSessionsSnapshot | None:
        """Observe until the answer is not ``scanning`` (nor a home just replaced),
        or ``deadline`` (monotonic) passes; return the last answer.

        With ``wait`` false (the sampler), an observation is always waited for
        to its end; with ``wait`` true (a request), waiting ends at
        ``deadline`` too, and None is returned if no observation ended by then.

        Raises:
            ShuttingDown, InternalError: as :meth:`observe`.
        """
        answer: ActiveSessionsSnapshot | None = None
        while True:
            try:
                answer = await self.observe(wanted, deadline=deadline if wait else math.inf)
            except NotInTime:
                return answer
            retry = answer.discovery == "scanning" or answer.gaps == [GAP_HOME_REPLACED]
            if not retry or time.monotonic() >= deadline:
                return answer
            await anyio.sleep(_RETRY_PAUSE_S)

    async def _fly(self, flight: Flight) -> None:
        try:
            self.begun += 1
            flight.number, flight.started_at = self.begun, time.monotonic()
            flight.snapshot = await self._run()
        except ObservationCancelled as exc:
            flight.error = exc
        except Exception as exc:
            log.exception("observation failed")
            flight.error = exc
        finally:
            self._flight = None
            flight.done.set()
