"""What wakes discovery besides the watch: exits, descendants, commits (docs/design.md §5, §8).

A change the watch cannot hear still wakes discovery, each through a part
that follows the latest observation and runs a task of its own:

* the exit watch (:class:`~capsuled.processes.exits.ExitWatch`) holds a pidfd
  for each process the answer rests on and wakes discovery when one exits;
* the descendant looks (:class:`~capsuled.processes.looks.DescendantLooks`)
  look for the sessions' new or exited descendants while some session has a
  live process;
* the commit wait (:class:`~capsuled.discovery.commit_wait.CommitWait`)
  waits out a writer's transaction the observation saw open, then wakes
  discovery to read its commit.

Where the exit watch cannot hold every process, exits are left to sampling
(:attr:`WakeSources.exits_unannounced`).
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from anyio.abc import TaskStatus

from capsuled.processes.exits import ExitWatch
from capsuled.processes.identity import Start
from capsuled.processes.looks import DescendantLooks
from capsuled.reader import Observation
from capsuled.watch.changes import ChangeFeed

from .commit_wait import CommitWait

__all__ = ["WakeSources"]


class WakeSources:
    """The exit watch, the descendant looks and the commit wait, each told of every observation.

    Args:
        exits: the exit watch.
        looks: the descendant looks.
        commits: the commit wait.

    Attributes:
        exits: the exit watch (its mode and counts are shown in ``status``).
    """

    def __init__(self, exits: ExitWatch, looks: DescendantLooks, commits: CommitWait) -> None:
        self.exits = exits
        self._looks = looks
        self._commits = commits

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the three until cancelled; started once the exit watch is."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.exits.serve)
            tg.start_soon(self._looks.run)
            tg.start_soon(self._commits.run)
            task_status.started()

    @property
    def exits_unannounced(self) -> bool:
        """Whether some exits are left to sampling (no pidfds here, or past their limit)."""
        return self.exits.mode == "sampling" or self.exits.unwatched > 0

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status`` (the exit watch's)."""
        return self.exits.notes

    def holding(self) -> Mapping[int, tuple[Start, int]]:
        """The processes the exit watch holds: pid → (start, pidfd)."""
        return self.exits.holding()

    def commit_awaited(self, changes: ChangeFeed) -> bool:
        """Whether what ``changes`` heard waits for a writer's commit instead of an
        observation now (:meth:`CommitWait.awaits`)."""
        return self._commits.awaits(changes)

    def observed(self, observation: Observation) -> None:
        """Follow ``observation``: hold its processes, wait out a transaction it saw open."""
        if observation.watched is not None:
            self.exits.track(observation.watched)
        if observation.store_writing:
            self._commits.owe()  # a commit heard may land after the version was read

    def published(self) -> None:
        """An observation was published: look for descendants if it left any to look for."""
        self._looks.observed()
