"""Long polls: requests with ``since`` that wait for an answer of another generation.

Each newly published generation wakes every waiting poll; shutting down
ends them all at once with -32005 (docs/design.md §7, §8).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from capsule_client.protocol import ActiveSessionsSnapshot

from .errors import ShuttingDown

__all__ = ["LongPolls"]


class LongPolls:
    """The long polls waiting for a new generation, and the event that wakes them.

    Args:
        latest: the latest published answer (not None once one was published).
    """

    def __init__(self, latest: Callable[[], ActiveSessionsSnapshot | None]) -> None:
        self._latest = latest
        self._published = anyio.Event()
        self._closing = False
        #: Polls waiting now (shown in ``status``).
        self.waiting = 0

    def published(self) -> None:
        """An answer of a new generation was published: wake every waiter."""
        published, self._published = self._published, anyio.Event()
        published.set()

    async def next_answer(self) -> None:
        """Return once an answer with a new generation is published."""
        await self._published.wait()

    async def wait_for_change(
        self, since: int, answer: ActiveSessionsSnapshot, deadline: float
    ) -> ActiveSessionsSnapshot:
        """Wait up to ``deadline`` (monotonic) for a settled answer of a generation not ``since``.

        Raises:
            ShuttingDown: :meth:`end` was called first.
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
                latest = self._latest()
                assert latest is not None
                answer = latest
        return answer

    def end(self) -> None:
        """End every long poll that waits for a change, and any that starts later.

        A change that arrived before still answers its poll.
        """
        self._closing = True
        self.published()
