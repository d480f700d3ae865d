"""Descendant looks: between observations, a look for new or exited descendants (docs/design.md §5).

:class:`DescendantLooks` runs one look every
:data:`~capsuled.processes.descendants.LOOK_INTERVAL_S` (1 s) while some session has
a live process or descendant, and none otherwise: an idle daemon sleeps
(docs/design.md §8). The interval is the latency of "descendants found after
a fork" without any other change, and bounds the window in which a child
that is re-parented before it is seen can escape. A look that finds a
change wakes discovery, which observes and publishes (``since`` long polls
and subscriptions see it).

Before each look the pid counter is read on the event loop (one read of
``/proc/loadavg``, kernel memory: it never waits on a disk). While it has not
moved, no process was started anywhere, so no descendant can have appeared;
exits are pidfd events of their own (:mod:`capsuled.processes.exits`). Only a moved
counter costs a look in a worker thread.

An observation that brought a root started before every look the tracker
keeps a mark of owes a look with a full table (``owed``,
:attr:`capsuled.reader.lineage.Lineage.owes_table`): that look runs at once
after the observation, not a second later.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread
import structlog

from .descendants import LOOK_INTERVAL_S
from .table import last_pid

__all__ = ["DescendantLooks"]

log = structlog.get_logger("capsuled.discovery")


class DescendantLooks:
    """The timer of the descendant looks.

    Args:
        look: one blocking look; True if the descendants changed (run in a
            worker thread).
        active: whether a look can find anything now.
        wake: asks discovery to observe (called on the event loop).
        owed: whether a look with a full table is owed (then it runs at once).
        counter: the pid counter (:func:`capsuled.processes.table.last_pid`), or
            None where it cannot be read: then every tick looks.
        interval_s: seconds between two looks while active.
    """

    def __init__(
        self,
        *,
        look: Callable[[], bool],
        active: Callable[[], bool],
        wake: Callable[[], None],
        owed: Callable[[], bool] = lambda: False,
        counter: Callable[[], int | None] = last_pid,
        interval_s: float = LOOK_INTERVAL_S,
    ) -> None:
        self._look = look
        self._owed = owed
        self._soon = anyio.Event()
        self._counter = counter
        self._counted: int | None = None  # the counter at the last look
        self._active = active
        self._wake = wake
        self.interval_s = interval_s
        self._activated = anyio.Event()
        #: Looks run so far (ticks with an unmoved pid counter are not looks),
        #: and those that found a change.
        self.looks = 0
        self.changes = 0

    def observed(self) -> None:
        """An observation was published: start looking if it left something to look at."""
        self._counted = None  # new roots: the next tick looks whatever the counter says
        if self._active():
            self._activated.set()
        if self._owed():
            self._soon.set()

    async def run(self) -> None:
        """Look every ``interval_s`` while active; sleep until :meth:`observed` otherwise."""
        while True:
            if not self._active():
                self._activated = anyio.Event()
                await self._activated.wait()
                continue
            if not self._owed():
                with anyio.move_on_after(self.interval_s):
                    await self._soon.wait()
            self._soon = anyio.Event()
            if not self._active():
                continue
            counted = self._counter()
            if counted is not None and counted == self._counted and not self._owed():
                continue  # no process started since the last look
            self._counted = counted
            self.looks += 1
            try:
                changed = await anyio.to_thread.run_sync(self._look)
            except OSError as exc:
                log.warning("a look for descendants failed", error=str(exc))
                continue
            if changed:
                self.changes += 1
                self._wake()
