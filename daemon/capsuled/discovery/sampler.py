"""The sampler: when discovery observes unasked (docs/design.md §8 "An idle daemon sleeps").

An observation at once whenever a wake-up asks (:mod:`capsuled.discovery.wakeups`:
a receipt or the store changed, a watched process exited), so answers
change within milliseconds of the event; one every ``sample_interval_s``
only where something can change unannounced; a verification every
``verify_interval_s``. An idle daemon sleeps. After an observation that
failed for a shortage of the daemon's own (out of descriptors), it tries
again after a short backoff (docs/design.md §8 "Out of descriptors").
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

import anyio
import structlog

from capsuled.errors import InternalError, ShuttingDown
from capsuled.reader import Observation

from .single_flight import SingleFlight
from .verification_runs import VerificationRuns
from .wakeups import Wakeups

__all__ = ["DEFAULT_SAMPLE_INTERVAL_S", "RETRY_FIRST_S", "RETRY_MAX_S", "Sampler"]

log = structlog.get_logger("capsuled.discovery")

#: Seconds between two sampled observations where they are needed, unless
#: configured otherwise (``--sample-interval``).
DEFAULT_SAMPLE_INTERVAL_S: Final = 1.0
#: The first retry after an observation short of descriptors or memory, and the
#: longest wait between two (docs/design.md §8): back within a second of relief.
RETRY_FIRST_S: Final = 0.05
RETRY_MAX_S: Final = 0.5


class Sampler:
    """The loop that observes on wake-ups, on the sample interval where needed, and verifies.

    Args:
        wakeups: the wake-ups it observes on.
        flight: where it asks for observations, as requests do.
        verification: the verification runs (their interval and barrier).
        needs_sampling: whether to observe every ``sample_interval_s`` even unwoken.
        verifies: whether a verification is worth running now (a watch feeds the reader).
        sample_interval_s: seconds between two sampled observations, where needed.

    Attributes:
        first_observation: set once the first observation is done.
        retry_s: seconds until the next try after a shortage (None: no shortage).
    """

    def __init__(
        self,
        wakeups: Wakeups,
        flight: SingleFlight,
        verification: VerificationRuns,
        *,
        needs_sampling: Callable[[], bool],
        verifies: Callable[[], bool],
        sample_interval_s: float,
    ) -> None:
        self._wakeups = wakeups
        self._flight = flight
        self._verification = verification
        self._needs_sampling = needs_sampling
        self._verifies = verifies
        self.sample_interval_s = sample_interval_s
        self.first_observation = anyio.Event()
        self.retry_s: float | None = None

    def max_age_s(self) -> float:
        """How old an answer may be without ``max_age_ms``, seconds.

        Any age while the watch and the exit events keep the latest answer
        current (nothing pending is checked apart); the sample interval
        where something can change unannounced (``needs_sampling``).
        """
        return self.sample_interval_s if self._needs_sampling() else math.inf

    def after(self, observation: Observation) -> None:
        """Back off and retry while the daemon is short of descriptors or memory, from
        :data:`RETRY_FIRST_S` to :data:`RETRY_MAX_S` (docs/design.md §8); a warning
        when a shortage begins, info when it ends."""
        if observation.shortage:
            if self.retry_s is None:
                log.warning(
                    "observation failed: the daemon is short of resources; retrying",
                    gaps=observation.snapshot.gaps,
                )
            self.retry_s = (
                RETRY_FIRST_S if self.retry_s is None else min(self.retry_s * 2, RETRY_MAX_S)
            )
        elif self.retry_s is not None:
            self.retry_s = None
            log.info(
                "observation recovered from the shortage", discovery=observation.snapshot.discovery
            )

    async def run(self) -> None:
        """Observe, then wait for a wake, the next sample or the next verification; forever."""
        verify_interval_s = self._verification.interval_s
        interval_s = math.inf if verify_interval_s is None else verify_interval_s
        next_verify = time.monotonic() + interval_s
        while True:
            await self._observe()
            self.first_observation.set()
            # A wake after the latest observation began (it drains the feed and
            # samples after it starts) owes another one now; else wait for one,
            # or for the next sample where exits are not all events.
            if not self._wakeups.owed:
                wait_s = next_verify - time.monotonic()
                if self._needs_sampling():
                    wait_s = min(wait_s, self.sample_interval_s)
                if self.retry_s is not None:
                    wait_s = min(wait_s, self.retry_s)
                await self._wakeups.wait(wait_s)
            if time.monotonic() >= next_verify:
                next_verify = time.monotonic() + interval_s
                if self._verifies():  # without a watch every observation walks
                    await self._verify()

    async def _observe(self) -> None:
        """One observation, retried while ``scanning`` up to a sample interval."""
        try:
            await self._flight.settle(time.monotonic() + self.sample_interval_s)
        except InternalError:
            pass  # logged with its traceback where it happened
        except ShuttingDown:
            await anyio.sleep_forever()  # stopped: wait to be cancelled

    async def _verify(self) -> None:
        """One verification run: a barrier through the watch, then an observation that
        verifies (begun after the barrier)."""
        await self._verification.pass_barrier()
        wanted = self._flight.wanted(time.monotonic(), 0.0)
        try:
            await self._flight.settle(time.monotonic() + self.sample_interval_s, wanted)
        except InternalError:
            pass  # logged with its traceback where it happened
