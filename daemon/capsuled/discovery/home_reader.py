"""The home's reader, and a fresh one when the home is replaced (docs/design.md §5 "What it keeps").

:class:`HomeReader` holds the :class:`~capsuled.reader.ActiveSessionReader`
of the home now and runs its observations in a worker thread, one at a
time: it counts them, and keeps the starts their samples read for the
latest few (``session.terminate`` signals by them, the argv cache names its
processes by them: docs/design.md §7, §14). When
an observation finds the home replaced or removed, it starts a fresh reader
for the path: the strictness is checked again, the generation count goes
on, a warning is logged and ``totals.readers_restarted`` counted.

The descendant looks and the commit wait ask it, not the reader's parts,
whether the sessions have descendants to look for and whether a writer
holds the store's lock: after a restart, they ask the fresh reader.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
import structlog

from capsule_client.wire import StatusTotals
from capsuled.processes.descendants import MAX_TRACKED_PIDFDS, DescendantTracker
from capsuled.processes.identity import Start
from capsuled.reader import ActiveSessionReader, Generations, Lineage, Observation, run_base
from capsuled.watch.changes import ChangeFeed

from . import heap

__all__ = ["HomeReader"]

log = structlog.get_logger("capsuled.discovery")

#: Recent observations whose sampled start times are kept for :meth:`HomeReader.sampled_starts`.
_SAMPLED_KEPT: Final = 4


def _observe(reader: ActiveSessionReader, verify_barrier_ns: int | None) -> Observation:
    """One observation; after a walk from scratch, the freed heap goes back to the OS."""
    observation = reader.observe(verify_barrier_ns=verify_barrier_ns)
    if observation.snapshot.cost.rescans:
        heap.trim()  # the walk's garbage
    return observation


class HomeReader:
    """The reader of one home, observed in a worker thread, restarted when the home is replaced.

    Args:
        home: the capsule home (docs/design.md §2), as configured.
        changes: the feed the watcher fills; each reader reads it.
        totals: the daemon's counters; observations, rescans and reader
            restarts are counted into it.
        descendant_pidfds: descriptors each reader's descendants tracker holds
            at most (``capsuled.processes.descendants``).

    Attributes:
        current: the reader now.
        changes: the feed the readers read.
        totals: the daemon's counters.
    """

    def __init__(
        self,
        home: Path,
        changes: ChangeFeed,
        *,
        totals: StatusTotals,
        descendant_pidfds: int = MAX_TRACKED_PIDFDS,
    ) -> None:
        self._requested_home = home
        self.changes = changes
        self.totals = totals
        self._descendant_pidfds = descendant_pidfds
        self._cancel = threading.Event()
        self._generations = Generations(run_base())
        # observed_at → pid → sampled start (``Observation.watched``), newest last.
        self._sampled: dict[float, Mapping[int, Start]] = {}
        self.current = self._new_reader()
        self._observed_by = self.current

    @property
    def home(self) -> Path:
        """The home as the reader sees it: absolute, symlinks resolved."""
        return self.current.home

    def stop(self) -> None:
        """Cancel the running observation between two reads; the reader observes no more."""
        self._cancel.set()

    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._cancel.is_set()

    async def observe(
        self,
        verify_barrier_ns: int | None,
        *,
        trust_watcher: bool,
        held: Mapping[int, tuple[Start, int]],
    ) -> Observation:
        """One observation of the reader now, in a worker thread, counted.

        Args:
            verify_barrier_ns: verify against this moment (Unix ns), or None.
            trust_watcher: whether a watcher feeds :attr:`changes`.
            held: the processes the exit watch holds (``ActiveSessionReader.held``).

        Raises:
            ObservationCancelled: :meth:`stop` was called.
        """
        reader = self._observed_by = self.current
        reader.trust_watcher = trust_watcher
        reader.held = held
        observation = await anyio.to_thread.run_sync(_observe, reader, verify_barrier_ns)
        self._sampled[observation.snapshot.observed_at] = observation.watched or {}
        while len(self._sampled) > _SAMPLED_KEPT:
            del self._sampled[next(iter(self._sampled))]
        self.totals.observations += 1
        self.totals.rescans += observation.snapshot.cost.rescans
        return observation

    def restart_if_replaced(self, observation: Observation) -> None:
        """A fresh reader for the path if ``observation`` found the home replaced or removed."""
        if not observation.home_replaced or self._observed_by is not self.current:
            return
        self.totals.readers_restarted += 1
        log.warning(
            "home directory was replaced or removed; starting a fresh reader",
            home=str(self._requested_home),
            gaps=observation.snapshot.gaps,
        )
        self.current.ownership.close()
        self.current.lineage.close()
        self.current = self._new_reader()

    def sampled_starts(self, observed_at: float) -> Mapping[int, Start]:
        """pid → the start the sample of the observation made at ``observed_at``
        read, for its answer's processes (empty for an observation no longer kept)."""
        return self._sampled.get(observed_at, {})

    def writing(self) -> bool:
        """Whether a writer's transaction holds the store's lock now (one ``fcntl``)."""
        return self.current.ownership.writing()

    def look(self) -> bool:
        """One look for the sessions' descendants between observations: whether they changed.

        Blocking; run it in a worker thread (:meth:`capsuled.reader.Lineage.look`).
        """
        return self.current.lineage.look()

    def descendants_active(self) -> bool:
        """Whether a look for descendants can find anything now."""
        return self.current.lineage.active

    def owes_table(self) -> bool:
        """Whether the next look for descendants must take a full process table."""
        return self.current.lineage.owes_table

    def _new_reader(self) -> ActiveSessionReader:
        tracker = DescendantTracker(children_files=False, max_pidfds=self._descendant_pidfds)
        return ActiveSessionReader(
            self._requested_home,
            self.changes,
            cancel=self._cancel,
            generations=self._generations,
            lineage=Lineage(tracker),
        )
