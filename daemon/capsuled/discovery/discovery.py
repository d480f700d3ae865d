"""Session discovery: the home's reader observed, and its answers served (docs/design.md §5, §7).

:class:`Discovery` ties its parts together; the composition root builds them
(:func:`capsuled.service.supervisor.build_discovery`):

* the reader (:mod:`~capsuled.discovery.home_reader`), observed in a worker
  thread and restarted when the home is replaced;
* single flight (:mod:`~capsuled.discovery.single_flight`): observations run
  one at a time, shared by every request that may use them;
* the wake-ups and the sampler (:mod:`~capsuled.discovery.wakeups`,
  :mod:`~capsuled.discovery.sampler`): an observation at once when the
  watch's feed or a wake source asks, one every ``sample_interval_s`` only
  where something can change unannounced (:attr:`Discovery.needs_sampling`);
* the wake sources (:mod:`~capsuled.discovery.wake_sources`): exits,
  descendant looks, commits on their way;
* verification runs (:mod:`~capsuled.discovery.verification_runs`);
* the latest answer and who hears of it
  (:mod:`~capsuled.discovery.latest_answer`), and which answer serves a
  ``sessions.snapshot`` request (:mod:`~capsuled.discovery.snapshot_answers`).

While a watcher runs (``native`` or ``polling``) the reader trusts it for
file changes: an observation reads only the paths it reported, and
verification is the net under what a watch may lose. While none runs (mode
``off``), every observation owes itself a walk from scratch: answers stay
right at the cost of a walk each time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final, TypeAlias

import anyio
import structlog
from anyio.abc import TaskStatus

from capsule_client.wire import (
    ActiveSessionsSnapshot,
    SnapshotParams,
    StatusTotals,
    VerificationStatus,
    WatcherMode,
)
from capsuled.processes.argv import ArgvCache
from capsuled.processes.exits import ExitWatch
from capsuled.processes.identity import Start
from capsuled.watch.changes import ChangeFeed

from .home_reader import HomeReader
from .latest_answer import LatestAnswer
from .sampler import Sampler
from .single_flight import SingleFlight
from .snapshot_answers import SnapshotAnswers
from .verification_runs import VerificationRuns
from .wake_sources import WakeSources
from .wakeups import Wakeups

__all__ = ["NO_WATCHER_NOTE", "CurrentWatcherMode", "Discovery"]

log = structlog.get_logger("capsuled.discovery")

NO_WATCHER_NOTE: Final = "no watcher runs: every observation walks the home from scratch"
#: What the watcher does now (``native``, ``polling`` or ``off``), asked before each use.
CurrentWatcherMode: TypeAlias = Callable[[], WatcherMode]


class Discovery:
    """The reader of one home, observed one at a time, answering snapshots.

    The composition root builds its parts and passes them in
    (:func:`capsuled.service.supervisor.build_discovery`); the three that call
    back into it it builds itself: single flight (which runs :meth:`_run`),
    the sampler and the snapshot answers.

    Args:
        reader: the home's reader.
        wakeups: the asks to observe now; the wake sources and the feed call
            its ``wake``.
        sources: the exit watch, the descendant looks and the commit wait.
        verification: the verification runs (their interval, barrier and counts).
        latest: the latest answer, its listeners and long polls.
        watcher_mode: what the watcher does now (``native``, ``polling`` or
            ``off``), asked before each use.
        sync: the watch's read-your-writes barrier (``HomeWatcher.sync``),
            awaited before an observation for ``max_age_ms: 0``; or None.
        sample_interval_s: seconds between two sampler observations where
            something can change unannounced; then also the most age of the
            answer a ``sessions.snapshot`` without ``max_age_ms`` gets.
    """

    def __init__(
        self,
        reader: HomeReader,
        *,
        wakeups: Wakeups,
        sources: WakeSources,
        verification: VerificationRuns,
        latest: LatestAnswer,
        watcher_mode: CurrentWatcherMode,
        sync: Callable[[], Awaitable[None]] | None,
        sample_interval_s: float,
    ) -> None:
        self.reader = reader
        self._wakeups = wakeups
        self._sources = sources
        self._verification = verification
        self._latest = latest
        self._watcher_mode = watcher_mode
        self._single = SingleFlight(self._run, reader.stopped)
        self._sampler = Sampler(
            wakeups,
            self._single,
            verification,
            needs_sampling=lambda: self.needs_sampling,
            verifies=lambda: self.watcher_mode != "off",
            sample_interval_s=sample_interval_s,
        )
        #: Set once the first observation is done.
        self.first_observation = self._sampler.first_observation
        self._answers = SnapshotAnswers(
            self._single,
            latest,
            default_max_age_s=self._sampler.max_age_s,
            pending=lambda: self.watcher_mode != "off" and bool(self.changes),
            stale_since=lambda: wakeups.stale_since,
            sync=sync,
            starts=reader.sampled_starts,
        )
        self.changes.listener = self._changed

    # ----------------------------------------------------------------------
    # State for status

    @property
    def changes(self) -> ChangeFeed:
        """The feed the watcher fills: changed paths under the home, rescan requests."""
        return self.reader.changes

    @property
    def totals(self) -> StatusTotals:
        """The daemon's counters (observations, rescans, reader restarts, verifications)."""
        return self.reader.totals

    @property
    def exits(self) -> ExitWatch:
        """The exit watch (``status`` shows its mode and counts)."""
        return self._sources.exits

    @property
    def verification(self) -> VerificationStatus:
        """What the verification runs found (``status.verification``)."""
        return self._verification.status

    @property
    def latest(self) -> ActiveSessionsSnapshot | None:
        """The latest observation's answer, None before the first."""
        return self._latest.latest

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status``."""
        notes = [] if self._latest.latest is not None else ["no observation yet"]
        if self.watcher_mode == "off":
            notes.append(NO_WATCHER_NOTE)
        return [*notes, *self._sources.notes]

    @property
    def watcher_mode(self) -> WatcherMode:
        """What feeds :attr:`changes` now: ``native``, ``polling`` or ``off`` (nothing)."""
        return self._watcher_mode()

    def request_rescan(self) -> None:
        """The next observation walks from scratch (``reader.rescan``, SIGHUP)."""
        self.changes.request_rescan()

    @property
    def announced(self) -> ActiveSessionsSnapshot | None:
        """The latest answer given to listeners: settled (not ``scanning``)."""
        return self._latest.announced

    def add_listener(self, listener: Callable[[ActiveSessionsSnapshot], None]) -> None:
        """Call ``listener`` (on the event loop) with each new settled answer."""
        self._latest.add_listener(listener)

    def wake(self) -> None:
        """Observe again now instead of at the next sample (see :meth:`Wakeups.wake`)."""
        self._wakeups.wake()

    def _changed(self) -> None:
        # Without a watcher, each observation owes itself a rescan through the
        # feed: waking on that would observe in a loop.
        if self.watcher_mode == "off":
            return
        # A store write heard inside a writer's transaction: observed once the
        # commit lands, not now and again then.
        if self._wakeups.on_loop and self._sources.commit_awaited(self.changes):
            return
        self.wake()

    # ----------------------------------------------------------------------
    # The service

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the sampler and the wake sources until cancelled.

        Reports started as soon as observations can be requested; the first
        observation follows (``first_observation`` is set once it is done).
        On the way out, a running observation is cancelled between two reads.
        """
        self._wakeups.bind_loop()
        try:
            async with anyio.create_task_group() as tg:
                self._single.task_group = tg
                await tg.start(self._sources.serve)
                task_status.started()
                try:
                    await self._sampler.run()
                except BaseException:
                    self.stop()  # before the task group waits for a running observation
                    raise
        finally:
            self._single.task_group = None
            self.stop()

    def stop(self) -> None:
        """Cancel the running observation between two reads; refuse new ones."""
        self.reader.stop()

    @property
    def needs_sampling(self) -> bool:
        """Whether the sampler must observe every ``sample_interval_s``.

        Only when something can change unannounced: no watch, exits that are
        not pidfd events (no pidfd here, past ``--max-pidfds``), or an answer
        that is not ``ready`` (a locked store says nothing when it is freed).
        Otherwise the daemon sleeps until a watch event or an exit.
        """
        latest = self._latest.latest
        return (
            self.watcher_mode == "off"
            or self._sources.exits_unannounced
            or latest is None
            or latest.discovery != "ready"
        )

    async def _run(self) -> ActiveSessionsSnapshot:
        """One observation, counted, published, followed (single flight's ``run``)."""
        trust_watcher = self.watcher_mode != "off"
        held = self._sources.holding()
        if not trust_watcher:
            self.changes.request_rescan()
        served = self._wakeups.begin()
        barrier_ns = self._verification.take_barrier()
        if not trust_watcher:
            barrier_ns = None  # it walks from scratch
        observation = await self.reader.observe(barrier_ns, trust_watcher=trust_watcher, held=held)
        self._sampler.after(observation)
        if observation.verified is not None:
            self._verification.count(observation.verified, watcher=self.watcher_mode)
        self.reader.restart_if_replaced(observation)
        self._sources.observed(observation)
        self._latest.publish(observation.snapshot)
        self._wakeups.answered(served)
        self._sources.published()
        return observation.snapshot

    # ----------------------------------------------------------------------
    # sessions.snapshot

    async def snapshot_json(self, params: SnapshotParams) -> tuple[bytes, ...]:
        """:meth:`snapshot` as JSON parts (:meth:`SnapshotAnswers.snapshot_json`)."""
        return await self._answers.snapshot_json(params)

    async def snapshot(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """Answer ``sessions.snapshot`` (:meth:`SnapshotAnswers.snapshot`)."""
        return await self._answers.snapshot(params)

    @property
    def argv(self) -> ArgvCache:
        """The argv of listed processes, shared by every answer with ``commands``."""
        return self._answers.argv

    async def next_answer(self) -> None:
        """Return once an answer with a new generation is published."""
        await self._latest.next_answer()

    @property
    def long_polls(self) -> int:
        """``since`` long polls waiting for a change now (shown in ``status``)."""
        return self._latest.waiting

    def end_long_polls(self) -> None:
        """End every ``since`` long poll that waits for a change, and any that starts later.

        They are answered -32005 at once instead of holding the shutdown's
        drain until their ``timeout_ms`` (docs/design.md §8).
        """
        self._latest.end_long_polls()

    def sampled_starts(self, observed_at: float) -> Mapping[int, Start]:
        """pid → the start the sample of the observation made at ``observed_at``
        read, for its answer's processes (empty for an observation no longer kept)."""
        return self.reader.sampled_starts(observed_at)
