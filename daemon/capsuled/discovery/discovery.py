"""Session discovery: the reader, its sampler, ``sessions.snapshot`` (docs/design.md §5, §7).

:class:`Discovery` owns the :class:`~capsuled.reader.ActiveSessionReader` of
the home and everything asynchronous around it:

* **single flight** (:mod:`capsuled.discovery.single_flight`): observations run one at a
  time, in a worker thread, shared by every request that may use them; with
  ``max_age_ms: 0`` a request waits for one begun after it arrived, so its
  answer reads everything written before it was sent;
* **the sampler** (:mod:`capsuled.discovery.wakeups`): an observation at once whenever
  the watcher's feed or :class:`~capsuled.processes.exits.ExitWatch` wakes it; one
  every ``sample_interval_s`` only where something can change unannounced
  (:attr:`Discovery.needs_sampling`). An idle daemon sleeps (docs/design.md §8);
* **descendant looks** (:mod:`capsuled.processes.looks`): between observations, a
  look every second for the sessions' new or exited descendants, only while
  some session has a live process; a change wakes the sampler;
* **commits on their way** (:mod:`capsuled.discovery.commit_wait`): an observation
  that found the store's write lock held owes another once it is free;
* **verification**: every ``verify_interval_s``, a barrier through the watch,
  then an observation that verifies (docs/design.md §5); what it finds the
  watch missed is logged at warning and counted in :attr:`verification`;
* **read-your-writes**: a request with ``max_age_ms: 0`` awaits the watch's
  barrier (``sync``) before it asks for an observation begun after it;
* **publication** (:mod:`capsuled.discovery.latest_answer`): each new settled answer
  goes to every listener (``capsuled.discovery.subscriptions``), each new generation
  wakes the long polls (``since``);
* **answers**: :meth:`Discovery.snapshot` answers from the latest observation
  when it is young enough and nothing is pending, otherwise observes, and
  retries ``scanning`` until ``ready`` or the request's deadline, which also
  bounds the wait for a stuck observation (see
  :meth:`~capsuled.discovery.latest_answer.Publication.late`);
* **home replaced**: a fresh reader for the path (the generation count goes
  on), a warning, and ``totals.readers_restarted``.

The watcher feeds :attr:`Discovery.changes` with changed paths under the home
(as configured or resolved: the reader maps one onto the other) and rescan
requests; ``watcher_mode`` tells Discovery what it does now. While a watcher
runs (``native`` or ``polling``), the reader trusts it for file changes: an
observation reads only the paths it reported and checks no other receipt
(verification is the net under what a watch may lose; see
:class:`~capsuled.reader.ActiveSessionReader`). While no watcher runs (mode
``off``), every observation owes a full rescan, so answers stay right at the
cost of a walk each time.

**Encoded once.** :meth:`Discovery.snapshot_json` answers with the reply's
JSON in parts (:mod:`capsuled.discovery.encoded_answer`): a request answered from the latest
observation costs a socket write, not an encoding or a copy; a new
observation whose answer did not change (its generation says so) costs a
small re-encoding.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Final

import anyio
import anyio.from_thread
import structlog
from anyio.abc import TaskStatus

from capsule_client.wire import (
    ActiveSessionsSnapshot,
    SnapshotParams,
    StatusTotals,
    VerificationStatus,
    WatcherMode,
)
from capsuled.discovery import heap
from capsuled.errors import InternalError, ShuttingDown
from capsuled.processes.argv import ArgvCache
from capsuled.processes.descendants import MAX_TRACKED_PIDFDS, DescendantTracker
from capsuled.processes.exits import DEFAULT_MAX_PIDFDS, ExitWatch
from capsuled.processes.looks import DescendantLooks
from capsuled.reader import ActiveSessionReader, Generations, Lineage, Observation, run_base
from capsuled.watch.changes import ChangeFeed

from .commit_wait import CommitWait
from .latest_answer import Publication
from .single_flight import SingleFlight, Wanted
from .snapshot import Answers
from .wakeups import Sampler, count_verification

__all__ = ["NO_WATCHER_NOTE", "Discovery"]

log = structlog.get_logger("capsuled.discovery")

NO_WATCHER_NOTE: Final = "no watcher runs: every observation walks the home from scratch"
#: Recent observations whose sampled start times are kept for :meth:`Discovery.session_processes`.
_SAMPLED_KEPT: Final = 4


def _observe(reader: ActiveSessionReader, verify_barrier_ns: int | None) -> Observation:
    """One observation; after a walk from scratch, the freed heap goes back to the OS."""
    observation = reader.observe(verify_barrier_ns=verify_barrier_ns)
    if observation.snapshot.cost.rescans:
        heap.trim()  # the walk's garbage
    return observation


class Discovery:
    """The reader of one home, observed one at a time, answering snapshots.

    Args:
        home: the capsule home (docs/design.md §2).
        sample_interval_s: seconds between two sampler observations; also the
            most age of the answer a ``sessions.snapshot`` without
            ``max_age_ms`` gets where something can change unannounced.
        totals: the daemon's counters; observations, rescans and reader
            restarts are counted into it.
        changes: the feed the watcher fills; a new one when omitted.
        watcher_mode: what the watcher does now (``native``, ``polling`` or
            ``off``), asked before each use; ``off`` when omitted.
        max_pidfds: exit descriptors held at most (``capsuled.processes.exits``).
        descendant_pidfds: descriptors the descendants tracker holds at most
            (``capsuled.processes.descendants``).
        exit_events: False leaves exits to sampling; None uses pidfds where
            the system has them.
        sync: the watch's read-your-writes barrier (``HomeWatcher.sync``):
            awaited before an observation for ``max_age_ms: 0`` and before
            each verification; none when omitted.
        verify_interval_s: seconds between two verification runs (``None``:
            never), while a watcher feeds the reader.
        on_missed: called (on the event loop) when a verification found
            changes the watch missed (``HomeWatcher.recheck``).
    """

    def __init__(
        self,
        home: Path,
        *,
        sample_interval_s: float = 1.0,
        totals: StatusTotals | None = None,
        changes: ChangeFeed | None = None,
        watcher_mode: Callable[[], WatcherMode] = lambda: "off",
        max_pidfds: int = DEFAULT_MAX_PIDFDS,
        descendant_pidfds: int = MAX_TRACKED_PIDFDS,
        exit_events: bool | None = None,
        sync: Callable[[], Awaitable[None]] | None = None,
        verify_interval_s: float | None = 30.0,
        on_missed: Callable[[], None] | None = None,
    ) -> None:
        self.sample_interval_s = sample_interval_s
        self._sync = sync
        self.verification = VerificationStatus(interval_s=verify_interval_s)
        self._verify_interval_s = verify_interval_s
        self._verify_barrier_ns: int | None = None  # owed to the next observation
        self._on_missed = on_missed
        self.totals = StatusTotals() if totals is None else totals
        self.changes = ChangeFeed() if changes is None else changes
        self._watcher_mode = watcher_mode
        self._requested_home = home
        self._descendant_pidfds = descendant_pidfds
        self._cancel = threading.Event()
        self._generations = Generations(run_base())
        self._reader = self._new_reader()
        self._pub = Publication()
        self._single = SingleFlight(self._run, self._cancel.is_set)
        self._sampler = Sampler(
            observe=self._sample,
            verify=self._verify,
            needs_sampling=lambda: self.needs_sampling,
            verifies=lambda: self.watcher_mode != "off",
            sample_interval_s=sample_interval_s,
            verify_interval_s=verify_interval_s,
        )
        #: Set once the first observation is done.
        self.first_observation = self._sampler.first_observation
        self._answers = Answers(
            self._single,
            self._pub,
            default_max_age_s=self._default_max_age_s,
            pending=lambda: self.watcher_mode != "off" and bool(self.changes),
            stale_since=lambda: self._sampler.stale_since,
            sync=sync,
        )
        self.exits = ExitWatch(self.wake, max_pidfds=max_pidfds, enabled=exit_events)
        self.looks = DescendantLooks(
            look=lambda: self._reader.lineage.look(),
            active=lambda: self._reader.lineage.active,
            wake=self.wake,
            owed=lambda: self._reader.lineage.owes_table,
        )
        self.commits = CommitWait(writing=lambda: self._reader.ownership.writing(), wake=self.wake)
        self.changes.listener = self._changed
        # observed_at → pid → sampled start time (``Observation.watched``), newest last.
        self._sampled: dict[float, Mapping[int, float]] = {}

    # ----------------------------------------------------------------------
    # State for status

    @property
    def home(self) -> Path:
        """The home as the reader sees it: absolute, symlinks resolved."""
        return self._reader.home

    @property
    def latest(self) -> ActiveSessionsSnapshot | None:
        """The latest observation's answer, None before the first."""
        return self._pub.latest

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status``."""
        notes = [] if self._pub.latest is not None else ["no observation yet"]
        if self.watcher_mode == "off":
            notes.append(NO_WATCHER_NOTE)
        return [*notes, *self.exits.notes]

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
        return self._pub.announced

    def add_listener(self, listener: Callable[[ActiveSessionsSnapshot], None]) -> None:
        """Call ``listener`` (on the event loop) with each new settled answer."""
        self._pub.add_listener(listener)

    def wake(self) -> None:
        """Observe again now instead of at the next sample (see :meth:`Sampler.wake`)."""
        self._sampler.wake()

    def _changed(self) -> None:
        # Without a watcher, each observation owes itself a rescan through the
        # feed: waking on that would observe in a loop.
        if self.watcher_mode == "off":
            return
        # The store's file moved while a writer's transaction is open: nothing
        # readable changed yet, and its commit makes no event when it lands.
        # Observe once the lock is free, not now and again then. (The lock is
        # asked only for a store event alone: not on every receipt's event.)
        if (
            self._sampler.on_loop
            and self.changes.store_alone
            and self._reader.ownership.writing()
            and self.changes.take_store_alone()
        ):
            self.commits.owe()
            return
        self.wake()

    # ----------------------------------------------------------------------
    # The service

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the sampler until cancelled.

        Reports started as soon as observations can be requested; the first
        observation follows (``first_observation`` is set once it is done).
        On the way out, a running observation is cancelled between two reads.
        """
        self._sampler.bind_loop()
        try:
            async with anyio.create_task_group() as tg:
                self._single.task_group = tg
                await tg.start(self.exits.serve)
                tg.start_soon(self.looks.run)
                tg.start_soon(self.commits.run)
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
        self._cancel.set()

    async def _sample(self) -> None:
        """One sampler observation, retried while ``scanning`` up to a sample interval."""
        try:
            await self._single.settle(time.monotonic() + self.sample_interval_s)
        except InternalError:
            pass  # logged with its traceback where it happened
        except ShuttingDown:
            await anyio.sleep_forever()  # stopped: wait to be cancelled

    @property
    def needs_sampling(self) -> bool:
        """Whether the sampler must observe every ``sample_interval_s``.

        Only when something can change unannounced: no watch, exits that are
        not pidfd events (no pidfd here, past ``--max-pidfds``), or an answer
        that is not ``ready`` (a locked store says nothing when it is freed).
        Otherwise the daemon sleeps until a watch event or an exit.
        """
        latest = self._pub.latest
        return (
            self.watcher_mode == "off"
            or self.exits.mode == "sampling"
            or self.exits.unwatched > 0
            or latest is None
            or latest.discovery != "ready"
        )

    def _default_max_age_s(self) -> float:
        """How old an answer may be without ``max_age_ms``, seconds.

        Any age while the watch and the exit events keep the latest answer
        current (nothing pending is checked apart); the sample interval
        where something can change unannounced (:attr:`needs_sampling`).
        """
        return self.sample_interval_s if self.needs_sampling else math.inf

    async def _verify(self) -> None:
        """One verification run: a barrier through the watch, then an observation that verifies."""
        barrier_ns = time.time_ns()
        if self._sync is not None:
            await self._sync()
        self._verify_barrier_ns = barrier_ns
        wanted = self._single.wanted(time.monotonic(), 0.0)
        try:
            await self._single.settle(time.monotonic() + self.sample_interval_s, wanted)
        except InternalError:
            pass  # logged with its traceback where it happened

    async def observe(
        self, wanted: Wanted | None = None, *, deadline: float = math.inf
    ) -> ActiveSessionsSnapshot:
        """One observation, shared with every caller that asks while it runs.

        See :meth:`capsuled.discovery.single_flight.SingleFlight.observe` (arguments, errors).
        """
        return await self._single.observe(wanted, deadline=deadline)

    async def _run(self) -> ActiveSessionsSnapshot:
        """One observation in a worker thread, counted, published (single flight's ``run``)."""
        reader = self._reader
        reader.trust_watcher = self.watcher_mode != "off"
        reader.held = self.exits.holding()
        if not reader.trust_watcher:
            self.changes.request_rescan()
        served = self._sampler.begin()
        barrier_ns, self._verify_barrier_ns = self._verify_barrier_ns, None
        if not reader.trust_watcher:
            barrier_ns = None  # it walks from scratch
        observation = await anyio.to_thread.run_sync(_observe, reader, barrier_ns)
        self._shortage(observation)
        self._keep_sampled(observation)
        self._count(observation)
        if observation.home_replaced and reader is self._reader:
            self._restart_reader(observation)
        if observation.watched is not None:
            self.exits.track(observation.watched)
        if observation.store_writing:
            self.commits.owe()  # a commit heard may land after the version was read
        self._pub.publish(observation.snapshot)
        self._sampler.answered(served)
        self.looks.observed()
        return observation.snapshot

    def _shortage(self, observation: Observation) -> None:
        """Back off and retry while the daemon is short of descriptors (docs/design.md §8);
        a warning when it begins, info when it ends."""
        if observation.shortage:
            if self._sampler.retry_s is None:
                log.warning(
                    "observation failed: the daemon is short of resources; retrying",
                    gaps=observation.snapshot.gaps,
                )
            self._sampler.short()
        elif self._sampler.retry_s is not None:
            self._sampler.recovered()
            log.info(
                "observation recovered from the shortage", discovery=observation.snapshot.discovery
            )

    def _keep_sampled(self, observation: Observation) -> None:
        self._sampled[observation.snapshot.observed_at] = observation.watched or {}
        while len(self._sampled) > _SAMPLED_KEPT:
            del self._sampled[next(iter(self._sampled))]

    def _count(self, observation: Observation) -> None:
        self.totals.observations += 1
        self.totals.rescans += observation.snapshot.cost.rescans
        verified = observation.verified
        if verified is None:
            return
        count_verification(
            verified,
            self.verification,
            self.totals,
            watcher=self.watcher_mode,
            on_missed=self._on_missed,
        )

    def _new_reader(self) -> ActiveSessionReader:
        tracker = DescendantTracker(children_files=False, max_pidfds=self._descendant_pidfds)
        return ActiveSessionReader(
            self._requested_home,
            self.changes,
            cancel=self._cancel,
            generations=self._generations,
            lineage=Lineage(tracker),
        )

    def _restart_reader(self, observation: Observation) -> None:
        self.totals.readers_restarted += 1
        log.warning(
            "home directory was replaced or removed; starting a fresh reader",
            home=str(self._requested_home),
            gaps=observation.snapshot.gaps,
        )
        self._reader.ownership.close()
        self._reader.lineage.close()
        self._reader = self._new_reader()

    # ----------------------------------------------------------------------
    # sessions.snapshot

    async def snapshot_json(self, params: SnapshotParams) -> tuple[bytes, ...]:
        """:meth:`snapshot` as JSON parts (:meth:`.snapshot.Answers.snapshot_json`)."""
        return await self._answers.snapshot_json(params)

    async def snapshot(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """Answer ``sessions.snapshot`` (:meth:`capsuled.discovery.snapshot.Answers.snapshot`)."""
        return await self._answers.snapshot(params)

    @property
    def argv(self) -> ArgvCache:
        """The argv of listed processes, shared by every answer with ``commands``."""
        return self._answers.argv

    async def next_answer(self) -> None:
        """Return once an answer with a new generation is published."""
        await self._pub.next_answer()

    @property
    def long_polls(self) -> int:
        """``since`` long polls waiting for a change now (shown in ``status``)."""
        return self._pub.waiting

    def end_long_polls(self) -> None:
        """End every ``since`` long poll that waits for a change, and any that starts later.

        They are answered -32005 at once instead of holding the shutdown's
        drain until their ``timeout_ms`` (docs/design.md §8).
        """
        self._pub.end_long_polls()

    def sampled_starts(self, observed_at: float) -> Mapping[int, float]:
        """pid → the start time the sample of the observation made at ``observed_at``
        read, for its answer's processes (empty for an observation no longer kept)."""
        return self._sampled.get(observed_at, {})
