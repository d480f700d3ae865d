"""The latest answer, and who hears of a new one (listeners, long polls).

Each observation's answer is published: it becomes the latest; a new
generation wakes every long poll (requests with ``since``); a new settled
answer (not ``scanning``) goes to every listener (``capsuled.discovery.subscriptions``).
Shutting down ends the long polls at once with -32005 (docs/design.md §7, §8).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import structlog

from capsule_client.wire import ActiveSessionsSnapshot, SnapshotParams
from capsuled.errors import DiscoveryUnavailable, ShuttingDown

__all__ = ["LatestAnswer"]

log = structlog.get_logger("capsuled.discovery")


class LatestAnswer:
    """The latest answer, its listeners and the long polls waiting for a new generation.

    Attributes:
        latest: the latest answer published, None before the first.
        latest_at: when it was published (monotonic seconds).
        announced: the latest answer given to listeners: settled (not ``scanning``).
        waiting: long polls waiting for a change now (shown in ``status``).
    """

    def __init__(self) -> None:
        self.latest: ActiveSessionsSnapshot | None = None
        self.latest_at = 0.0
        self.announced: ActiveSessionsSnapshot | None = None
        self.waiting = 0
        self._listeners: list[Callable[[ActiveSessionsSnapshot], None]] = []
        self._published = anyio.Event()
        self._closing = False

    def add_listener(self, listener: Callable[[ActiveSessionsSnapshot], None]) -> None:
        """Call ``listener`` (on the event loop) with each new settled answer."""
        self._listeners.append(listener)

    def publish(self, snapshot: ActiveSessionsSnapshot) -> None:
        """Make ``snapshot`` the latest; wake long polls and tell listeners if it is new."""
        previous = self.latest
        if snapshot.discovery == "unavailable" and (
            previous is None
            or previous.discovery != "unavailable"
            or previous.gaps != snapshot.gaps
        ):
            log.warning("session discovery unavailable", gaps=snapshot.gaps)
        elif snapshot.discovery == "ready" and previous and previous.discovery == "unavailable":
            log.info("session discovery ready again")
        self.latest = snapshot
        self.latest_at = time.monotonic()
        if previous is None or previous.generation != snapshot.generation:
            self._wake_polls()
        announced = self.announced
        if snapshot.discovery != "scanning" and (
            announced is None or announced.generation != snapshot.generation
        ):
            self.announced = snapshot
            for listener in self._listeners:
                listener(snapshot)

    async def next_answer(self) -> None:
        """Return once an answer with a new generation is published."""
        await self._published.wait()

    async def wait_for_change(
        self, since: int, answer: ActiveSessionsSnapshot, deadline: float
    ) -> ActiveSessionsSnapshot:
        """Wait up to ``deadline`` (monotonic) for a settled answer of a generation not ``since``.

        Raises:
            ShuttingDown: :meth:`end_long_polls` was called first.
        """
        with anyio.move_on_after(max(deadline - time.monotonic(), 0)):
            while answer.generation == since or answer.discovery == "scanning":
                if self._closing:
                    raise ShuttingDown("shutting down: the long poll ends without a change")
                self.waiting += 1
                try:
                    await self._published.wait()
                finally:
                    self.waiting -= 1
                assert self.latest is not None
                answer = self.latest
        return answer

    def end_long_polls(self) -> None:
        """End every long poll that waits for a change, and any that starts later.

        A change that arrived before still answers its poll.
        """
        self._closing = True
        self._wake_polls()

    def late(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """The answer when ``timeout_ms`` passed while the request waited for an observation.

        The observation goes on (others share it); the request gets, by its
        deadline, the latest observation's answer (its ``observed_at`` tells
        its age) -- as a request whose observations stayed ``scanning`` gets
        the last of them. A request that set ``max_age_ms`` gets it only if it
        is younger than that (so never with ``max_age_ms: 0``); otherwise, or
        before the first observation, -32001.

        Raises:
            DiscoveryUnavailable: no answer fits (the message says the
                observation did not finish within ``timeout_ms``).
        """
        latest = self.latest
        if latest is not None and (
            params.max_age_ms is None
            or time.monotonic() - self.latest_at < params.max_age_ms / 1000
        ):
            return latest
        raise DiscoveryUnavailable(
            "discovery unavailable: the observation did not finish within timeout_ms "
            f"({params.timeout_ms} ms); it goes on, ask again"
        )

    def _wake_polls(self) -> None:
        published, self._published = self._published, anyio.Event()
        published.set()
