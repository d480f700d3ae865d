"""Answering ``sessions.snapshot``: which observation serves a request (docs/design.md §7).

The latest answer serves when it is young enough for ``max_age_ms`` and
nothing is pending; otherwise the request shares an observation (single
flight) retried while ``scanning``, within ``timeout_ms``. ``max_age_ms: 0``
first awaits the watch's barrier (read-your-writes); ``since`` long-polls
for another generation; ``usage`` measures the processes for the request,
``commands`` names them (their argv, :mod:`capsuled.processes.commands`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

import anyio
import msgspec

from capsule_client.wire import ActiveSessionsSnapshot, SnapshotParams
from capsuled.processes.argv import ArgvCache
from capsuled.processes.commands import with_commands
from capsuled.processes.identity import Start
from capsuled.processes.ports import with_ports
from capsuled.processes.usage import UsageMeter, with_usage

from .encoded_answer import EncodedAnswer, encoder
from .latest_answer import LatestAnswer
from .single_flight import SingleFlight

__all__ = ["SnapshotAnswers"]


class SnapshotAnswers:
    """Answers ``sessions.snapshot`` from the latest answer and single flight.

    Args:
        flight: the observations to share.
        latest: the latest answer and the long polls.
        default_max_age_s: the age an answer may have when the request sets
            no ``max_age_ms``, seconds (asked each time).
        pending: whether changes wait to be read (the latest answer is then stale).
        stale_since: when the latest wake came (monotonic seconds) if the latest
            answer was begun before it, else None; an observation begun after
            it serves (:attr:`capsuled.discovery.wakeups.Wakeups.stale_since`).
        sync: the watch's read-your-writes barrier, or None.
        starts: an answer's ``observed_at`` → pid → the start its sample read
            (the argv cache names processes by their ticks, docs/design.md §14).
    """

    def __init__(
        self,
        flight: SingleFlight,
        latest: LatestAnswer,
        *,
        default_max_age_s: Callable[[], float],
        pending: Callable[[], bool],
        stale_since: Callable[[], float | None],
        sync: Callable[[], Awaitable[None]] | None,
        starts: Callable[[float], Mapping[int, Start]] | None = None,
    ) -> None:
        self._flight = flight
        self._latest = latest
        self._default_max_age_s = default_max_age_s
        self._pending = pending
        self._stale_since = stale_since
        self._sync = sync
        self._encoded = EncodedAnswer()
        self._usage = UsageMeter()
        #: The argv of the processes answers list, for ``commands: true``.
        self.argv = ArgvCache(starts)

    async def snapshot_json(self, params: SnapshotParams) -> tuple[bytes, ...]:
        """:meth:`snapshot`, encoded as JSON (the ``result`` of the reply), in parts.

        Joined, the parts are the JSON text; they are sent as they are
        (:class:`~capsuled.discovery.encoded_answer.EncodedAnswer`). An answer with ``usage``,
        ``commands`` or ``ports`` is made for its request, so it is encoded for it alone.
        """
        answer = await self._answer(params)
        if params.usage or params.commands or params.ports:
            made = await self._for_request(answer, params)
            return (encoder.encode(msgspec.structs.replace(made, task=params.task)),)
        return self._encoded.parts(answer, params.task)

    async def snapshot(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """Answer ``sessions.snapshot`` (docs/design.md §7).

        From the latest observation if it is younger than ``max_age_ms``
        (without it: any age while events keep it current, else the sample
        interval) and nothing is pending; otherwise an
        observation that began no longer than ``max_age_ms`` before the
        request arrived (shared; ``max_age_ms: 0``: one that began after it),
        retried while ``scanning`` until ``ready`` or ``timeout_ms``. With
        ``since``: at once if the generation differs, else wait for a new one
        up to ``timeout_ms``. An ``unavailable`` answer is returned as it is,
        its gaps saying why.

        Raises:
            DiscoveryUnavailable: ``timeout_ms`` passed before an observation
                the request may use ended (see :meth:`LatestAnswer.late`).
            ShuttingDown: the daemon is stopping; a long poll ends with it.
        """
        answer = await self._for_request(await self._answer(params), params)
        return msgspec.structs.replace(answer, task=params.task)

    async def _for_request(
        self, answer: ActiveSessionsSnapshot, params: SnapshotParams
    ) -> ActiveSessionsSnapshot:
        """``answer`` with what ``params`` asks to add: usage, commands, ports."""
        if params.commands:
            # Read-your-writes covers exec too: every process is checked now.
            answer = await with_commands(answer, self.argv, fresh=params.max_age_ms == 0)
        if params.ports:
            answer = await with_ports(answer)
        if params.usage:
            answer = await with_usage(answer, self._usage)
        return answer

    def _fresh(self, max_age_s: float) -> ActiveSessionsSnapshot | None:
        latest = self._latest.latest
        if (
            latest is None
            or latest.discovery == "scanning"
            or time.monotonic() - self._latest.latest_at >= max_age_s
            or self._pending()
        ):
            return None
        return latest

    def _max_age_s(self, params: SnapshotParams) -> float:
        """How old an answer ``params`` accepts, seconds."""
        if params.max_age_ms is not None:
            return params.max_age_ms / 1000
        return self._default_max_age_s()

    async def _answer(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """The observation that answers ``params``, as published (its ``task`` not set)."""
        arrived_at = time.monotonic()
        deadline = arrived_at + params.timeout_ms / 1000
        max_age_s = self._max_age_s(params)
        if max_age_s == 0 and self._sync is not None:
            # Read-your-writes: once the barrier passed, every change made
            # before the request is fed; only an observation begun after it serves.
            with anyio.move_on_after(max(deadline - time.monotonic(), 0.0)):
                await self._sync()
            arrived_at = time.monotonic()
        # Heard of a change the latest answer may miss (a watch event, an exit,
        # a descendant, a commit landed): only an observation begun after it serves.
        stale_since = self._stale_since()
        answer = self._fresh(max_age_s) if stale_since is None else None
        if answer is None:
            wanted = self._flight.wanted(arrived_at, max_age_s, begun_after=stale_since)
            settled = await self._flight.settle(deadline, wanted, wait=True)
            answer = settled or self._latest.late(params)
        if params.since is not None:
            answer = await self._latest.wait_for_change(params.since, answer, deadline)
        return answer
