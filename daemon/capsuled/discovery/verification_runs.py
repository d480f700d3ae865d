"""Verification runs: the net under what a watch may lose (docs/design.md §5 "Trusting the watch").

Every ``verify_interval_s`` while a watch feeds the reader, a run passes the
watch's read-your-writes barrier and then asks for an observation that
verifies: one that compares every listed directory and every candidate with
what was last seen, and counts a difference older than the barrier as a
change the watch missed. :class:`VerificationRuns` keeps the barrier owed to
that observation and counts what each run found: missed changes are logged
at warning, counted in ``status.verification`` and the totals, and the watch
is told to check itself again (``HomeWatcher.recheck``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

import structlog

from capsule_client.wire import StatusTotals, VerificationStatus
from capsuled.reader import Verified

__all__ = ["DEFAULT_VERIFY_INTERVAL_S", "VerificationRuns"]

log = structlog.get_logger("capsuled.discovery")

#: Seconds between two verification runs, unless configured otherwise (``--verify-interval``).
DEFAULT_VERIFY_INTERVAL_S: Final = 30.0
#: Missed paths named in the warning at most (the count says how many in all).
_MISSED_LOGGED: Final = 10


class VerificationRuns:
    """The barrier a verification run owes its observation, and what the runs found.

    Args:
        totals: the daemon's counters; runs and changes found are counted into it.
        interval_s: seconds between two runs (None: never).
        sync: the watch's read-your-writes barrier (``HomeWatcher.sync``); none
            when omitted.
        on_missed: called (on the event loop) when a run found changes the
            watch missed (``HomeWatcher.recheck``).

    Attributes:
        status: what ``status.verification`` shows.
    """

    def __init__(
        self,
        totals: StatusTotals,
        *,
        interval_s: float | None,
        sync: Callable[[], Awaitable[None]] | None = None,
        on_missed: Callable[[], None] | None = None,
    ) -> None:
        self._totals = totals
        self.interval_s = interval_s
        self._sync = sync
        self._on_missed = on_missed
        self.status = VerificationStatus(interval_s=interval_s)
        self._barrier_ns: int | None = None  # owed to the next observation

    async def pass_barrier(self) -> None:
        """Pass the watch's barrier; the next observation verifies against the moment it began."""
        barrier_ns = time.time_ns()
        if self._sync is not None:
            await self._sync()
        self._barrier_ns = barrier_ns

    def take_barrier(self) -> int | None:
        """The barrier an observation beginning now verifies against (Unix ns), once; None
        when no run owes one."""
        barrier_ns, self._barrier_ns = self._barrier_ns, None
        return barrier_ns

    def count(self, verified: Verified, *, watcher: str) -> None:
        """Count one run into :attr:`status` and the totals.

        Changes it found the watch missed are logged at warning, and
        ``on_missed`` is called (the watch rechecks itself).
        """
        found = len(verified.missed)
        self._totals.verifications += 1
        self._totals.verification_changes += found
        status = self.status
        status.runs += 1
        status.changes_found += found
        status.last_at = time.time()
        status.last_changes = found
        status.last_checked = verified.checked
        if found:
            log.warning(
                "verification found changes the watch did not report",
                changes=found,
                paths=verified.missed[:_MISSED_LOGGED],
                watcher=watcher,
            )
            if self._on_missed is not None:
                self._on_missed()
