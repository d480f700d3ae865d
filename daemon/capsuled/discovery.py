"""Session discovery: the reader, its sampler, ``sessions.snapshot`` (docs/design.md §5, §7).

:class:`Discovery` owns the :class:`~capsuled.reader.ActiveSessionReader` of
the home and everything asynchronous around it:

* **single flight**: observations run one at a time, in a worker thread, in
  Discovery's own task group; a request that arrives while one runs waits for
  it and shares its result, and a request that gives up does not cancel it.
  A request shares a running observation only if that observation began no
  longer than its ``max_age_ms`` before it arrived: otherwise (always with
  ``max_age_ms: 0``) it waits for the next one, which every request waiting
  so shares, so its answer reads everything written before it was sent;
* **the sampler**: an observation at once whenever it is woken: by the
  watcher's feed (a receipt or the store changed) or by
  :class:`~capsuled.exits.ExitWatch` (a watched process exited), so answers
  change within milliseconds of the event; one every ``sample_interval_s``
  only where something can change unannounced (:attr:`Discovery.needs_sampling`:
  no watch, exits that are not pidfd events, an answer that is not ready).
  An idle daemon sleeps (docs/design.md §8);
* **verification**: every ``verify_interval_s``, a barrier through the watch
  and then an observation that compares every listed directory and every
  candidate with what was last seen (docs/design.md §5); what it finds the
  watch missed is logged at warning and counted in :attr:`verification`;
* **read-your-writes**: a request with ``max_age_ms: 0`` awaits the watch's
  barrier (``sync``) before it asks for an observation begun after it;
* **listeners**: each new answer that is not ``scanning`` and whose
  generation differs from the previous one's goes to every listener
  (``capsuled.subscriptions``);
* **answers**: :meth:`Discovery.snapshot` answers from the latest observation
  when it is young enough and nothing is pending, otherwise observes, and
  retries ``scanning`` until ``ready`` or the request's deadline; with
  ``since`` it long-polls for a new generation (ended -32005 by
  :meth:`Discovery.end_long_polls` when the daemon shuts down). The
  deadline also bounds the wait for an observation: a stuck one goes on for
  whoever shares it, and the request gets the latest answer (or -32001 when
  it set ``max_age_ms`` and the latest is older);
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
JSON in parts: the latest answer is encoded once per observation and
``task``, and its two long lists (``sessions``, ``unowned``) once per change
of either (the reader hands back the same list objects while nothing
changed), each in its own buffer that the parts refer to. A request answered
from the latest observation costs a socket write, not an encoding or a copy;
a new observation whose lists did not change costs a small re-encoding.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

import anyio
import anyio.from_thread
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus

from capsule_client.protocol import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    DiscoveryState,
    Session,
    SessionProcess,
    SnapshotParams,
    StatusTotals,
    VerificationStatus,
    WatcherMode,
)

from . import heap
from .changes import ChangeFeed
from .errors import DiscoveryUnavailable, InternalError, ShuttingDown
from .exits import DEFAULT_MAX_PIDFDS, ExitWatch
from .processes import UsageMeter
from .reader import (
    GAP_HOME_REPLACED,
    ActiveSessionReader,
    Generations,
    Observation,
    ObservationCancelled,
    run_base,
)

__all__ = ["NO_WATCHER_NOTE", "Discovery"]

log = structlog.get_logger("capsuled.discovery")

NO_WATCHER_NOTE: Final = "no watcher runs: every observation walks the home from scratch"

_encoder: Final = msgspec.json.Encoder()

#: What the two long lists are replaced by while the rest of a snapshot is encoded.
_PLACEHOLDERS: Final = b'"sessions":0,"unowned":0'
_SESSIONS_KEY: Final = b'"sessions":'
_UNOWNED_KEY: Final = b',"unowned":'


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A snapshot's JSON text in parts: the lists ``sessions`` and ``unowned``
    encoded on their own (reused while the lists are), the rest around them."""

    answer: ActiveSessionsSnapshot
    task: str | None
    #: The head up to ``"sessions":``, the sessions, ``,"unowned":``, the unowned, the tail.
    parts: tuple[bytes, bytes, bytes, bytes, bytes]

    @property
    def sessions(self) -> bytes:
        return self.parts[1]

    @property
    def unowned(self) -> bytes:
        return self.parts[3]


def _encode(
    answer: ActiveSessionsSnapshot, task: str | None, previous: _Encoded | None
) -> _Encoded:
    """Encode ``answer`` with ``task``, reusing ``previous``'s bytes for lists it shares."""
    if (
        previous is not None
        and previous.answer.sessions is answer.sessions
        and previous.answer.unowned is answer.unowned
    ):
        sessions, unowned = previous.sessions, previous.unowned
    else:
        sessions = _encoder.encode(answer.sessions)
        unowned = _encoder.encode(answer.unowned)
    placeholder = msgspec.Raw(b"0")
    rest = msgspec.structs.replace(
        answer,
        task=task,
        sessions=cast(list[Session], placeholder),
        unowned=cast(list[SessionProcess], placeholder),
    )
    head = _encoder.encode(rest)
    at = head.index(_PLACEHOLDERS)  # the keys come after strings, which escape '"'
    parts = (
        head[:at] + _SESSIONS_KEY,
        sessions,
        _UNOWNED_KEY,
        unowned,
        head[at + len(_PLACEHOLDERS) :],
    )
    return _Encoded(answer, task, parts)


def _observe(reader: ActiveSessionReader, verify_barrier_ns: int | None) -> Observation:
    """One observation; after a walk from scratch, the freed heap goes back to the OS."""
    observation = reader.observe(verify_barrier_ns=verify_barrier_ns)
    if observation.snapshot.cost.rescans:
        heap.trim()  # the walk's garbage
    return observation


#: Pause between two attempts of an observation that answered ``scanning``.
_RETRY_PAUSE_S: Final = 0.005


class _Flight:
    """One running observation and whoever waits for it.

    Attributes:
        number: observations begun before it, plus one; 0 until it begins.
        started_at: when it began (monotonic seconds): on the event loop, just
            before its worker thread takes the changes and the process sample,
            so it reads everything written before a request that arrived
            earlier.
    """

    def __init__(self) -> None:
        self.number = 0
        self.started_at = math.inf
        self.done = anyio.Event()
        self.snapshot: ActiveSessionsSnapshot | None = None
        self.error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class _Wanted:
    """Which running observation a request may share (docs/design.md §7 ``max_age_ms``).

    One that began after the request arrived always serves; one that began
    earlier serves only if its start is younger than ``max_age_s`` at the
    request's arrival. So ``max_age_ms: 0`` never shares an observation that
    was already running: it waits for the next one (and shares that one with
    every other request that waits for it).
    """

    begun: int  # observations begun before the request arrived (a flight not begun serves)
    arrived_at: float  # monotonic
    max_age_s: float

    def accepts(self, flight: _Flight) -> bool:
        return flight.number > self.begun or self.arrived_at - flight.started_at < self.max_age_s


class _NotInTime(Exception):
    """The request's deadline passed while it waited for an observation."""


class Discovery:
    """The reader of one home, observed one at a time, answering snapshots.

    Args:
        home: the capsule home (docs/design.md §2).
        sample_interval_s: seconds between two sampler observations; also the
            default ``max_age_ms`` of ``sessions.snapshot``.
        totals: the daemon's counters; observations, rescans and reader
            restarts are counted into it.
        changes: the feed the watcher fills; a new one when omitted.
        watcher_mode: what the watcher does now (``native``, ``polling`` or
            ``off``), asked before each use; ``off`` when omitted.
        max_pidfds: exit descriptors held at most (``capsuled.exits``).
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
        self.first_observation = anyio.Event()
        self._requested_home = home
        self._cancel = threading.Event()
        self._generations = Generations(run_base())
        self._reader = self._new_reader()
        self._latest: ActiveSessionsSnapshot | None = None
        self._encoded: _Encoded | None = None
        self._latest_at = 0.0  # monotonic
        self._flight: _Flight | None = None
        self._flights = 0  # observations begun so far
        self._closing = False  # set by end_long_polls()
        self._long_polls = 0
        self._published = anyio.Event()
        self._tg: TaskGroup | None = None
        self._wake = anyio.Event()
        self._wakes = 0  # wake() calls so far
        self._served = 0  # wake() calls before the latest observation began
        self._loop_thread: int | None = None
        self._listeners: list[Callable[[ActiveSessionsSnapshot], None]] = []
        self._announced: ActiveSessionsSnapshot | None = None
        self._usage = UsageMeter()
        self.exits = ExitWatch(self.wake, max_pidfds=max_pidfds, enabled=exit_events)
        self.changes.listener = self._changed

    # ----------------------------------------------------------------------
    # State for status

    @property
    def home(self) -> Path:
        """The home as the reader sees it: absolute, symlinks resolved."""
        return self._reader.home

    @property
    def latest(self) -> ActiveSessionsSnapshot | None:
        """The latest observation's answer, None before the first."""
        return self._latest

    @property
    def state(self) -> DiscoveryState | None:
        """The latest observation's ``discovery``, None before the first."""
        return None if self._latest is None else self._latest.discovery

    @property
    def last_cost(self) -> DiscoveryCost | None:
        return None if self._latest is None else self._latest.cost

    @property
    def last_observed_at(self) -> float | None:
        return None if self._latest is None else self._latest.observed_at

    @property
    def notes(self) -> list[str]:
        """Plain-language remarks for ``status``."""
        notes = [] if self._latest is not None else ["no observation yet"]
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
        return self._announced

    def add_listener(self, listener: Callable[[ActiveSessionsSnapshot], None]) -> None:
        """Call ``listener`` (on the event loop) with each new settled answer."""
        self._listeners.append(listener)

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
        self._wake.set()

    def _changed(self) -> None:
        # Without a watcher, each observation owes itself a rescan through the
        # feed: waking on that would observe in a loop.
        if self.watcher_mode != "off":
            self.wake()

    # ----------------------------------------------------------------------
    # The service

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the sampler until cancelled.

        Reports started as soon as observations can be requested; the first
        observation follows (``first_observation`` is set once it is done).
        On the way out, a running observation is cancelled between two reads.
        """
        self._loop_thread = threading.get_ident()
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self.exits.serve)
                task_status.started()
                try:
                    await self._sample_forever()
                except BaseException:
                    self.stop()  # before the task group waits for a running observation
                    raise
        finally:
            self._tg = None
            self.stop()

    def stop(self) -> None:
        """Cancel the running observation between two reads; refuse new ones."""
        self._cancel.set()

    async def _sample_forever(self) -> None:
        interval_s = math.inf if self._verify_interval_s is None else self._verify_interval_s
        next_verify = time.monotonic() + interval_s
        while True:
            try:
                await self._settle(time.monotonic() + self.sample_interval_s)
            except InternalError:
                pass  # logged with its traceback where it happened
            except ShuttingDown:
                await anyio.sleep_forever()  # stopped: wait to be cancelled
            self.first_observation.set()
            # A wake after the latest observation began (it drains the feed and
            # samples after it starts) owes another one now; else wait for one,
            # or for the next sample where exits are not all events.
            if self._wakes == self._served:
                wake = self._wake = anyio.Event()
                wait_s = next_verify - time.monotonic()
                if self.needs_sampling:
                    wait_s = min(wait_s, self.sample_interval_s)
                with anyio.move_on_after(max(wait_s, 0.0)):
                    await wake.wait()
            if time.monotonic() >= next_verify:
                next_verify = time.monotonic() + interval_s
                if self.watcher_mode != "off":  # without a watch every observation walks
                    await self._verify()

    @property
    def needs_sampling(self) -> bool:
        """Whether the sampler must observe every ``sample_interval_s``.

        Only when something can change unannounced: no watch, exits that are
        not pidfd events (no pidfd here, past ``--max-pidfds``), or an answer
        that is not ``ready`` (a locked store says nothing when it is freed).
        Otherwise the daemon sleeps until a watch event or an exit.
        """
        latest = self._latest
        return (
            self.watcher_mode == "off"
            or self.exits.mode == "sampling"
            or self.exits.unwatched > 0
            or latest is None
            or latest.discovery != "ready"
        )

    async def _verify(self) -> None:
        """One verification run: a barrier through the watch, then an observation that verifies."""
        barrier_ns = time.time_ns()
        if self._sync is not None:
            await self._sync()
        self._verify_barrier_ns = barrier_ns
        wanted = _Wanted(self._flights, time.monotonic(), 0.0)
        try:
            await self._settle(time.monotonic() + self.sample_interval_s, wanted)
        except InternalError:
            pass  # logged with its traceback where it happened

    async def observe(
        self, wanted: _Wanted | None = None, *, deadline: float = math.inf
    ) -> ActiveSessionsSnapshot:
        """One observation, shared with every caller that asks while it runs.

        Args:
            wanted: which running observation the caller may share; a running
                one it does not accept is waited out, and the next one shared
                (single flight still: docs/design.md §5). None: any.
            deadline: monotonic time after which the caller stops waiting (the
                observation goes on for whoever else shares it).

        Raises:
            ShuttingDown: the daemon is stopping (or :meth:`serve` is not running).
            InternalError: the observation failed on a defect (logged with its traceback).
            _NotInTime: ``deadline`` passed first.
        """
        while True:
            flight = self._flight
            if flight is None:
                if self._tg is None or self._cancel.is_set():
                    raise ShuttingDown("shutting down: sessions are no longer observed")
                flight = self._flight = _Flight()
                self._tg.start_soon(self._fly, flight)
            with anyio.move_on_after(deadline - time.monotonic()):
                await flight.done.wait()
            if not flight.done.is_set():
                raise _NotInTime
            if wanted is None or wanted.accepts(flight):
                break
        if flight.snapshot is not None:
            return flight.snapshot
        if flight.error is None or isinstance(flight.error, ObservationCancelled):
            raise ShuttingDown("shutting down: the observation was cancelled")
        raise InternalError(f"observation failed: {flight.error!r}") from flight.error

    async def _fly(self, flight: _Flight) -> None:
        try:
            self._flights += 1
            flight.number, flight.started_at = self._flights, time.monotonic()
            reader = self._reader
            reader.trust_watcher = self.watcher_mode != "off"
            if not reader.trust_watcher:
                self.changes.request_rescan()
            self._served = self._wakes
            barrier_ns, self._verify_barrier_ns = self._verify_barrier_ns, None
            if not reader.trust_watcher:
                barrier_ns = None  # it walks from scratch
            observation = await anyio.to_thread.run_sync(_observe, reader, barrier_ns)
            self._count(observation)
            if observation.home_replaced and reader is self._reader:
                self._restart_reader(observation)
            flight.snapshot = observation.snapshot
            if observation.watched is not None:
                self.exits.track(observation.watched)
            self._publish(observation.snapshot)
        except ObservationCancelled as exc:
            flight.error = exc
        except Exception as exc:
            log.exception("observation failed")
            flight.error = exc
        finally:
            self._flight = None
            flight.done.set()

    def _count(self, observation: Observation) -> None:
        self.totals.observations += 1
        self.totals.rescans += observation.snapshot.cost.rescans
        verified = observation.verified
        if verified is None:
            return
        found = len(verified.missed)
        self.totals.verifications += 1
        self.totals.verification_changes += found
        status = self.verification
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
                watcher=self.watcher_mode,
            )
            if self._on_missed is not None:
                self._on_missed()

    def _new_reader(self) -> ActiveSessionReader:
        return ActiveSessionReader(
            self._requested_home,
            self.changes,
            cancel=self._cancel,
            generations=self._generations,
        )

    def _restart_reader(self, observation: Observation) -> None:
        self.totals.readers_restarted += 1
        log.warning(
            "home directory was replaced or removed; starting a fresh reader",
            home=str(self._requested_home),
            gaps=observation.snapshot.gaps,
        )
        self._reader.ownership.close()
        self._reader = self._new_reader()

    def _publish(self, snapshot: ActiveSessionsSnapshot) -> None:
        previous = self._latest
        if snapshot.discovery == "unavailable" and (
            previous is None
            or previous.discovery != "unavailable"
            or previous.gaps != snapshot.gaps
        ):
            log.warning("session discovery unavailable", gaps=snapshot.gaps)
        elif snapshot.discovery == "ready" and previous and previous.discovery == "unavailable":
            log.info("session discovery ready again")
        self._latest = snapshot
        self._latest_at = time.monotonic()
        if previous is None or previous.generation != snapshot.generation:
            published, self._published = self._published, anyio.Event()
            published.set()
        announced = self._announced
        if snapshot.discovery != "scanning" and (
            announced is None or announced.generation != snapshot.generation
        ):
            self._announced = snapshot
            for listener in self._listeners:
                listener(snapshot)

    async def _settle(
        self, deadline: float, wanted: _Wanted | None = None, *, wait: bool = False
    ) -> ActiveSessionsSnapshot | None:
        """Observe until the answer is not ``scanning`` (nor a home just replaced),
        or ``deadline`` (monotonic) passes; return the last answer.

        With ``wait`` false (the sampler), an observation is always waited for
        to its end; with ``wait`` true (a request), waiting ends at
        ``deadline`` too, and None is returned if no observation ended by then.
        """
        answer: ActiveSessionsSnapshot | None = None
        while True:
            try:
                answer = await self.observe(wanted, deadline=deadline if wait else math.inf)
            except _NotInTime:
                return answer
            retry = answer.discovery == "scanning" or answer.gaps == [GAP_HOME_REPLACED]
            if not retry or time.monotonic() >= deadline:
                return answer
            await anyio.sleep(_RETRY_PAUSE_S)

    # ----------------------------------------------------------------------
    # sessions.snapshot

    def _fresh(self, max_age_s: float) -> ActiveSessionsSnapshot | None:
        latest = self._latest
        if (
            latest is None
            or latest.discovery == "scanning"
            or time.monotonic() - self._latest_at >= max_age_s
            or (self.watcher_mode != "off" and self.changes)
        ):
            return None
        return latest

    def _max_age_s(self, params: SnapshotParams) -> float:
        """How old an answer ``params`` accepts, seconds.

        By default any age while the watch and the exit events keep the latest
        answer current (nothing pending is checked apart); the sample interval
        where something can change unannounced (:attr:`needs_sampling`).
        """
        if params.max_age_ms is not None:
            return params.max_age_ms / 1000
        return self.sample_interval_s if self.needs_sampling else math.inf

    async def snapshot_json(self, params: SnapshotParams) -> tuple[bytes, ...]:
        """:meth:`snapshot`, encoded as JSON (the ``result`` of the reply), in parts.

        Joined, the parts are the JSON text; they are sent as they are. They
        are kept for the latest answer and ``task``: a request for the same
        again is answered without encoding, and a new answer whose lists did
        not change re-encodes only the rest (the observed time, the cost),
        never the megabytes of the lists. An answer with ``usage`` is
        measured for its request, so it is encoded for it alone.
        """
        answer = await self._answer(params)
        if params.usage:
            measured = await self._with_usage(answer)
            return (_encoder.encode(msgspec.structs.replace(measured, task=params.task)),)
        encoded = self._encoded
        if encoded is None or encoded.answer is not answer or encoded.task != params.task:
            encoded = self._encoded = _encode(answer, params.task, encoded)
        return encoded.parts

    async def snapshot(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """Answer ``sessions.snapshot`` (docs/design.md §7).

        From the latest observation if it is younger than ``max_age_ms``
        (default: the sample interval) and nothing is pending; otherwise an
        observation that began no longer than ``max_age_ms`` before the
        request arrived (shared; ``max_age_ms: 0``: one that began after it),
        retried while ``scanning`` until ``ready`` or ``timeout_ms``. With
        ``since``: at once if the generation differs, else wait for a new one
        up to ``timeout_ms``. An ``unavailable`` answer is returned as it is,
        its gaps saying why.
        """
        answer = await self._answer(params)
        if params.usage:
            answer = await self._with_usage(answer)
        return msgspec.structs.replace(answer, task=params.task)

    async def _answer(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """The observation that answers ``params``, as published (its ``task`` not set).

        Raises:
            DiscoveryUnavailable: ``timeout_ms`` passed before an observation
                the request may use ended (see :meth:`_late`).
            ShuttingDown: the daemon is stopping; a long poll ends with it.
        """
        arrived_at = time.monotonic()
        deadline = arrived_at + params.timeout_ms / 1000
        max_age_s = self._max_age_s(params)
        if max_age_s == 0 and self._sync is not None:
            # Read-your-writes: once the barrier passed, every change made
            # before the request is fed; only an observation begun after it serves.
            with anyio.move_on_after(max(deadline - time.monotonic(), 0.0)):
                await self._sync()
            arrived_at = time.monotonic()
        answer = self._fresh(max_age_s)
        if answer is None:
            wanted = _Wanted(self._flights, arrived_at, max_age_s)
            answer = await self._settle(deadline, wanted, wait=True) or self._late(params)
        if params.since is not None:
            answer = await self._wait_for_change(params.since, answer, deadline)
        return answer

    def _late(self, params: SnapshotParams) -> ActiveSessionsSnapshot:
        """The answer when ``timeout_ms`` passed while the request waited for an observation.

        The observation goes on (others share it); the request gets, by its
        deadline, the latest observation's answer (its ``observed_at`` tells
        its age) -- as a request whose observations stayed ``scanning`` gets
        the last of them. A request that set ``max_age_ms`` gets it only if it
        is younger than that (so never with ``max_age_ms: 0``); otherwise, or
        before the first observation, -32001.

        Raises:
            DiscoveryUnavailable: no answer fits (the message says the
                observation did not finish within ``timeout_ms``).
        """
        latest = self._latest
        if latest is not None and (
            params.max_age_ms is None
            or time.monotonic() - self._latest_at < params.max_age_ms / 1000
        ):
            return latest
        raise DiscoveryUnavailable(
            "discovery unavailable: the observation did not finish within timeout_ms "
            f"({params.timeout_ms} ms); it goes on, ask again"
        )

    async def _with_usage(self, answer: ActiveSessionsSnapshot) -> ActiveSessionsSnapshot:
        """A copy of ``answer`` whose processes carry ``cpu_percent`` and ``rss_bytes``."""
        keys = {(p.pid, p.started_at) for p in _processes(answer)}
        usage = await anyio.to_thread.run_sync(self._usage.measure, keys)

        def measured(process: SessionProcess) -> SessionProcess:
            found = usage.get((process.pid, process.started_at))
            if found is None:
                return process
            return msgspec.structs.replace(process, cpu_percent=found[0], rss_bytes=found[1])

        return msgspec.structs.replace(
            answer,
            sessions=[
                msgspec.structs.replace(s, processes=[measured(p) for p in s.processes])
                for s in answer.sessions
            ],
            unowned=[measured(p) for p in answer.unowned],
        )

    async def _wait_for_change(
        self, since: int, answer: ActiveSessionsSnapshot, deadline: float
    ) -> ActiveSessionsSnapshot:
        """Wait up to ``deadline`` for a settled answer whose generation is not ``since``.

        Raises:
            ShuttingDown: :meth:`end_long_polls` was called first.
        """
        with anyio.move_on_after(max(deadline - time.monotonic(), 0)):
            while answer.generation == since or answer.discovery == "scanning":
                if self._closing:
                    raise ShuttingDown("shutting down: the long poll ends without a change")
                self._long_polls += 1
                try:
                    await self._published.wait()
                finally:
                    self._long_polls -= 1
                assert self._latest is not None
                answer = self._latest
        return answer

    async def next_answer(self) -> None:
        """Return once an answer with a new generation is published."""
        await self._published.wait()

    @property
    def long_polls(self) -> int:
        """``since`` long polls waiting for a change now (shown in ``status``)."""
        return self._long_polls

    def end_long_polls(self) -> None:
        """End every ``since`` long poll that waits for a change, and any that starts later.

        They are answered -32005 at once instead of holding the shutdown's
        drain until their ``timeout_ms`` (docs/design.md §8 finishes requests in
        flight; a long poll has nothing more to wait for). A change that
        arrived before still answers its poll.
        """
        self._closing = True
        published, self._published = self._published, anyio.Event()
        published.set()


def _processes(answer: ActiveSessionsSnapshot) -> list[SessionProcess]:
    return [*(p for s in answer.sessions for p in s.processes), *answer.unowned]
