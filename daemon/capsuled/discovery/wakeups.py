"""Wake-ups: the asks to observe now, counted against the observations that serve them.

The watch's feed, the exit watch, the descendant looks and the commit wait
call :meth:`Wakeups.wake` when they hear of a change; the sampler observes on
it (:mod:`capsuled.discovery.sampler`). Each wake is counted, so that an
observation knows which wakes it serves (those before it began), and a
request knows whether the latest answer began before the latest wake
(:attr:`Wakeups.stale_since`): that answer may miss what the wake announced,
and only an observation begun after it serves (docs/design.md §5, §7).
"""

from __future__ import annotations

import math
import threading
import time

import anyio
import anyio.from_thread

__all__ = ["Wakeups"]


class Wakeups:
    """The wakes so far, the ones the latest observations serve, and the wait for the next."""

    def __init__(self) -> None:
        self._wake = anyio.Event()
        self._wakes = 0  # wake() calls so far
        self._served = 0  # wake() calls before the latest observation began
        self._answered = 0  # wake() calls before the latest published observation began
        self._woken_at = -math.inf  # the latest wake() call, monotonic seconds
        self._loop_thread: int | None = None

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
    def owed(self) -> bool:
        """Whether a wake came after the latest observation began: another is owed now."""
        return self._wakes != self._served

    @property
    def stale_since(self) -> float | None:
        """When the latest wake came (monotonic seconds) if the latest published answer
        was begun before it, else None: that answer may miss what the wake announced,
        and an observation begun after it is owed (it is running or about to)."""
        return self._woken_at if self._wakes > self._answered else None

    async def wait(self, timeout_s: float) -> None:
        """Return at the next wake, or once ``timeout_s`` passed."""
        wake = self._wake = anyio.Event()
        with anyio.move_on_after(max(timeout_s, 0.0)):
            await wake.wait()
