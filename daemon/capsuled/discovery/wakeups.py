"""The sampler: when discovery observes unasked, and the wake-ups that ask it to.

An observation at once whenever the sampler is woken: by the watcher's feed
(a receipt or the store changed) or by the exit watch (a watched process
exited), so answers change within milliseconds of the event; one every
``sample_interval_s`` only where something can change unannounced; a
verification every ``verify_interval_s``. An idle daemon sleeps
(docs/design.md §8). After an observation that failed for a shortage of
the daemon's own (out of descriptors), it tries again after a short backoff.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.from_thread
import structlog

from capsule_client.wire import StatusTotals, VerificationStatus
from capsuled.reader import Verified

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "Sampler", "count_verification"]

log = structlog.get_logger("capsuled.discovery")

#: The first retry after an observation short of descriptors or memory, and the
#: longest wait between two (docs/design.md §8): back within a second of relief.
RETRY_FIRST_S: Final = 0.05
RETRY_MAX_S: Final = 0.5


class Sampler:
    """Wake-ups, counted, and the loop that observes on them.

    Args:
        observe: one settled observation (errors already handled).
        verify: one verification run.
        needs_sampling: whether to observe every ``sample_interval_s`` even unwoken.
        verifies: whether a verification is worth running now (a watch feeds the reader).
        sample_interval_s: seconds between two sampled observations, where needed.
        verify_interval_s: seconds between two verifications (None: never).
    """

    def __init__(
        self,
        *,
        observe: Callable[[], Awaitable[None]],
        verify: Callable[[], Awaitable[None]],
        needs_sampling: Callable[[], bool],
        verifies: Callable[[], bool],
        sample_interval_s: float,
        verify_interval_s: float | None,
    ) -> None:
        self._observe = observe
        self._verify = verify
        self._needs_sampling = needs_sampling
        self._verifies = verifies
        self.sample_interval_s = sample_interval_s
        self._verify_interval_s = verify_interval_s
        self.first_observation = anyio.Event()
        self._wake = anyio.Event()
        self._wakes = 0  # wake() calls so far
        self._served = 0  # wake() calls before the latest observation began
        self._answered = 0  # wake() calls before the latest published observation began
        self._woken_at = -math.inf  # the latest wake() call, monotonic seconds
        self._loop_thread: int | None = None
        #: Seconds until the next try after a shortage (None: no shortage).
        self.retry_s: float | None = None

    def short(self) -> None:
        """The latest observation failed for a shortage of the daemon's own: try again
        soon, backing off from :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S` (docs/design.md §8)."""
        self.retry_s = RETRY_FIRST_S if self.retry_s is None else min(self.retry_s * 2, RETRY_MAX_S)

    def recovered(self) -> None:
        """The latest observation was not short of anything."""
        self.retry_s = None

    def wake(self) -> None:
        """Observe again now instead of at the next sample.

        Meant for the event loop's thread (the watcher and the exit watch
        call it there); from an anyio worker thread it is handed to the
        loop; from any other thread it does nothing (the next sample notices).
        """
        if self._loop_thread is None or threading.get_ident() == self._loop_thread:
            self._woken()
            return
        try:
            anyio.from_thread.run_sync(self._woken)
        except RuntimeError:  # not an anyio worker thread, or the loop is gone
            pass

    def _woken(self) -> None:
        self._wakes += 1
        self._woken_at = time.monotonic()
        self._wake.set()

    @property
    def on_loop(self) -> bool:
        """Whether the calling thread is the event loop's (once :meth:`bind_loop` ran)."""
        return self._loop_thread is not None and threading.get_ident() == self._loop_thread

    def bind_loop(self) -> None:
        """The calling thread is the event loop's: wakes from elsewhere are handed to it."""
        self._loop_thread = threading.get_ident()

    def begin(self) -> int:
        """An observation begins: it serves every wake so far (it drains the feed after).

        Returns the wakes it serves, for :meth:`answered` once its answer is published.
        """
        self._served = self._wakes
        return self._served

    def answered(self, served: int) -> None:
        """The answer of the observation whose :meth:`begin` returned ``served`` is published."""
        self._answered = max(self._answered, served)

    @property
    def stale_since(self) -> float | None:
        """When the latest wake came (monotonic seconds) if the latest published answer
        was begun before it, else None: that answer may miss what the wake announced,
        and an observation begun after it is owed (it is running or about to)."""
        return self._woken_at if self._wakes > self._answered else None

    async def run(self) -> None:
        """Observe, then wait for a wake, the next sample or the next verification; forever."""
        interval_s = math.inf if self._verify_interval_s is None else self._verify_interval_s
        next_verify = time.monotonic() + interval_s
        while True:
            await self._observe()
            self.first_observation.set()
            # A wake after the latest observation began (it drains the feed and
            # samples after it starts) owes another one now; else wait for one,
            # or for the next sample where exits are not all events.
            if self._wakes == self._served:
                wake = self._wake = anyio.Event()
                wait_s = next_verify - time.monotonic()
                if self._needs_sampling():
                    wait_s = min(wait_s, self.sample_interval_s)
                if self.retry_s is not None:
                    wait_s = min(wait_s, self.retry_s)
                with anyio.move_on_after(max(wait_s, 0.0)):
                    await wake.wait()
            if time.monotonic() >= next_verify:
                next_verify = time.monotonic() + interval_s
                if self._verifies():  # without a watch every observation walks
                    await self._verify()


def count_verification(
    verified: Verified,
    status: VerificationStatus,
    totals: StatusTotals,
    *,
    watcher: str,
    on_missed: Callable[[], None] | None,
) -> None:
    """Count one verification run into ``status`` and ``totals``.

    Changes it found the watch missed are logged at warning, and
    ``on_missed`` is called (the watch rechecks itself).
    """
    found = len(verified.missed)
    totals.verifications += 1
    totals.verification_changes += found
    status.runs += 1
    status.changes_found += found
    status.last_at = time.time()
    status.last_changes = found
    status.last_checked = verified.checked
    if found:
        log.warning(
            "verification found changes the watch did not report",
            changes=found,
            paths=verified.missed[:10],
            watcher=watcher,
        )
        if on_missed is not None:
            on_missed()
