"""Lineage: the descendants of a home's sessions, at and between observations (docs/design.md §5).

:class:`Lineage` holds the home's :class:`~capsuled.processes.descendants.DescendantTracker`.
An observation gives it the roots (the owned live receipts' processes and
the store's (pid, start) rows that matched the sample), the start ticks the
sample read for them (what names each root from look to look, whatever the
clock does: docs/design.md §14) and the sample's full process table
(:func:`~capsuled.processes.sample.sample_with_table`: the same
``/proc`` pass, no second read of every stat); the projection lists what it
returns. An observation that neither walks nor verifies has no table (its
sample is partial): the tracker then looks by its cheap strategies, and a
new root started before every look it keeps a mark of leaves a table owed
(:attr:`Lineage.owes_table`). Between observations the daemon calls
:meth:`Lineage.look` on a timer while :attr:`Lineage.active`, and at once
while a table is owed: a look (with a full table only when owed) that says
whether the descendants changed since the last observation, which then
observes again.

Between tables the tracker probes the pids handed out since its last look
(the pid counter), not the children lists of the session's processes even
where the kernel has them: a probe also finds a process whose parent exited
before the look but that is in a Unix session a session process leads (a
double-forked daemon under a ``setsid`` root), which no children list names.

The tracker is used by one caller at a time (a lock): observations and
looks run in different worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from capsuled.processes.descendants import Descendant, DescendantTracker
from capsuled.processes.sample import ProcessSample
from capsuled.processes.table import ProcessTable, take_table

from .candidates import Candidates
from .ownership import Owners, row_matches

__all__ = ["Lineage", "roots_of"]

#: (pid, started_at) → descendant.
Found = Mapping[tuple[int, int], Descendant]


def roots_of(
    candidates: Candidates, owners: Owners, sample: ProcessSample, tolerance_s: float
) -> dict[tuple[int, int], str]:
    """(pid, started_at) → session id of every owned live receipt's process and every
    store row whose process runs in ``sample`` (within ``tolerance_s``).

    An unowned receipt's process is no root: its children belong to no session.
    """
    roots = candidates.owned_processes()  # kept as owners move: O(the processes), not receipts
    for pid, rows in owners.rows.items():
        for row in rows:
            if row_matches(sample, pid, row, tolerance_s):
                roots.setdefault((pid, row.started_at), row.session_id)
    return roots


class Lineage:
    """The descendants of one home's sessions, kept between observations.

    Args:
        tracker: the tracker to use; a new one probing by the pid counter when omitted.
    """

    def __init__(self, tracker: DescendantTracker | None = None) -> None:
        self._tracker = DescendantTracker(children_files=False) if tracker is None else tracker
        self._lock = threading.Lock()
        self._roots: dict[tuple[int, int], str] = {}
        self._root_ticks: dict[int, int] = {}
        self._found: Found = {}

    @property
    def active(self) -> bool:
        """Whether a look can find anything: some root or descendant was live at the last one."""
        return bool(self._roots) or bool(self._found)

    @property
    def owes_table(self) -> bool:
        """Whether the next look must take a full table (a new root older than every kept look)."""
        return self._tracker.owes_table

    @property
    def found(self) -> Found:
        """The descendants of the latest observation."""
        return self._found

    def observe(
        self,
        roots: dict[tuple[int, int], str],
        table: ProcessTable | None,
        sample: ProcessSample,
    ) -> Found:
        """The descendants now, for an observation (with its full table where it has one).

        ``sample`` is the observation's: the roots' start ticks are taken from
        it, and name them at this look and the looks until the next observation.
        Blocking (reads ``/proc`` without a table); run it in a worker thread.
        """
        with self._lock:
            self._roots = roots
            self._root_ticks = {}
            for pid, _ in roots:
                start = sample.get(pid)
                if start is not None and start.ticks is not None:
                    self._root_ticks[pid] = start.ticks
            if roots or self._found:
                self._found = self._tracker.look(roots, table, self._root_ticks)
            # else no session has a process: nothing to index the table for
            return self._found

    def look(self) -> bool:
        """One look between observations, at the latest observation's roots: whether a
        descendant appeared or exited since then (the caller observes again).

        Blocking; O(the sessions' processes and what was forked since the last look).
        """
        with self._lock:
            if not self.active:
                return False
            table = take_table() if self._tracker.owes_table else None
            found = self._tracker.look(self._roots, table, self._root_ticks)
            # A descendant keeps the start time it was first listed with, so the
            # keys name the same processes whatever the clock did since.
            return found.keys() != self._found.keys()

    def forget(self) -> None:
        """Drop every descendant and root (the reader's cache is being rebuilt)."""
        with self._lock:
            self._tracker.forget()
            self._roots = {}
            self._root_ticks = {}
            self._found = {}

    def close(self) -> None:
        """Let the tracker's pidfds go."""
        with self._lock:
            self._tracker.close()
            self._roots = {}
            self._found = {}
