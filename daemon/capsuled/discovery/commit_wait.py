"""A store commit still on its way owes an observation when it lands (docs/design.md §5).

An observation that found a writer's transaction open when it read the
store's version (:attr:`capsuled.reader.Observation.store_writing`) may
have read the version before a commit the watch had already reported, and
a store change heard while the transaction is open is not observed at all
until it ends (:meth:`CommitWait.awaits`): nothing else wakes discovery once the commit
is published (the index it is published in makes no file event).
:class:`CommitWait` asks the write lock
(:meth:`capsuled.reader.store.OwnershipReader.writing`, one ``fcntl``) every
half millisecond while a commit's sync may still be running, then at growing
pauses (longer ones once it has been held for a second), and wakes discovery
once it is free: its next observation reads the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import anyio

from capsuled.watch.changes import ChangeFeed

__all__ = ["CommitWait"]

#: The pause before the lock is asked again, seconds, for the first ``QUICK_FOR_S``
#: (a commit's sync); then doubled up to the maximum.
FIRST_PAUSE_S: Final = 0.0005
QUICK_FOR_S: Final = 0.01
MAX_PAUSE_S: Final = 0.05
#: A transaction open longer than this, seconds, is asked about at the longer pause:
#: a runtime that keeps one open for minutes costs 4 lock questions a second, not 20.
LONG_AFTER_S: Final = 1.0
LONG_PAUSE_S: Final = 0.25


class CommitWait:
    """Wakes discovery once the store's write transaction seen open has ended.

    Args:
        writing: whether a write transaction is open now (on the event loop).
        wake: asks discovery to observe.
    """

    def __init__(self, *, writing: Callable[[], bool], wake: Callable[[], None]) -> None:
        self._writing = writing
        self._wake = wake
        self._owed = anyio.Event()
        #: Write transactions waited out so far.
        self.waits = 0

    def owe(self) -> None:
        """An observation saw a write transaction open: wake discovery when it ends."""
        self._owed.set()

    def awaits(self, changes: ChangeFeed) -> bool:
        """Whether the feed heard a store write alone while a writer's transaction is open:
        then the change is taken from the feed and the commit waited out (owed).

        Nothing readable changed yet, and the commit makes no event when it
        lands: discovery observes once the lock is free, not now and again
        then. The lock is asked only for a store event alone, not on every
        receipt's event.
        """
        if changes.store_alone and self._writing() and changes.take_store_alone():
            self.owe()
            return True
        return False

    async def run(self) -> None:
        """Wait for :meth:`owe`, then for the lock to be free, then wake; forever."""
        while True:
            await self._owed.wait()
            self._owed = anyio.Event()
            pause_s = FIRST_PAUSE_S
            began = anyio.current_time()
            while self._writing():
                await anyio.sleep(pause_s)
                held_s = anyio.current_time() - began
                if held_s >= QUICK_FOR_S:
                    most = MAX_PAUSE_S if held_s < LONG_AFTER_S else LONG_PAUSE_S
                    pause_s = min(pause_s * 2, most)
            self.waits += 1
            self._wake()
