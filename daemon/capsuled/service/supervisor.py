"""The supervisor: one anyio task group and the daemon's lifecycle (docs/design.md §8).

Start-up binds the socket, starts each service with ``tg.start`` (so a bind
error reaches the caller and "ready" means ready): the watcher, session
discovery (:func:`build_discovery` builds it from its parts, :mod:`capsuled.discovery`),
the subscriptions it feeds (:mod:`capsuled.discovery.subscriptions`), then
the server; then it waits for a shutdown (:class:`capsuled.service.lifecycle.Lifecycle`,
the one shutdown state). The daemon is the composition root: it builds the
services and hands each method handler (:mod:`capsuled.handlers`) only what
that handler needs.
Shutdown: answer long polls -32005, stop accepting, close idle connections
(subscriptions end with them), let in-flight requests finish for up to
``drain_timeout_s``, cancel the rest (a running observation stops between two
file reads), remove the socket.
Signal handlers only set state: one task reads the signals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import structlog
from anyio import open_signal_receiver  # imported now: a lazy import needs a descriptor
from anyio.abc import TaskStatus

from capsule_client.kit.paths import records_root, remove_made_dirs
from capsule_client.wire import NoParams, StatusTotals
from capsuled.common.shortage import is_shortage, shortage_gap
from capsuled.discovery.commit_wait import CommitWait
from capsuled.discovery.discovery import CurrentWatcherMode, Discovery
from capsuled.discovery.home_reader import HomeReader
from capsuled.discovery.latest_answer import LatestAnswer
from capsuled.discovery.sampler import DEFAULT_SAMPLE_INTERVAL_S
from capsuled.discovery.subscriptions import SubscriptionHub
from capsuled.discovery.verification_runs import DEFAULT_VERIFY_INTERVAL_S, VerificationRuns
from capsuled.discovery.wake_sources import WakeSources
from capsuled.discovery.wakeups import Wakeups
from capsuled.handlers import method_table
from capsuled.handlers.metrics import metrics_handler
from capsuled.handlers.reconcile import Reconciles
from capsuled.handlers.sessions import (
    rescan_handler,
    snapshot_handler,
    subscribe_handler,
    unsubscribe_handler,
)
from capsuled.handlers.status import StatusFigures, ping, status_handler
from capsuled.handlers.terminate import fresh_session_processes, terminate_handler
from capsuled.metrics.collector import DaemonCollector, RequestMetrics, count_reconcile
from capsuled.metrics.textfile import TextfileWriter
from capsuled.processes.descendants import MAX_TRACKED_PIDFDS
from capsuled.processes.exits import DEFAULT_MAX_PIDFDS, ExitWatch
from capsuled.processes.looks import DescendantLooks
from capsuled.rpc import sockets
from capsuled.rpc.jsonrpc import Dispatcher, Method
from capsuled.rpc.peers import refuse_peer
from capsuled.rpc.server import Server, UnixListener
from capsuled.service import budget, notify
from capsuled.startup_errors import ServiceError
from capsuled.watch.changes import ChangeFeed
from capsuled.watch.watcher import HomeWatcher

from .config import Config
from .home_setup import ensure_home
from .lifecycle import Lifecycle

__all__ = ["StartupError", "Supervisor", "build_discovery"]

log = structlog.get_logger("capsuled")


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def build_discovery(
    home: Path,
    *,
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S,
    totals: StatusTotals | None = None,
    changes: ChangeFeed | None = None,
    watcher_mode: CurrentWatcherMode = lambda: "off",
    max_pidfds: int = DEFAULT_MAX_PIDFDS,
    descendant_pidfds: int = MAX_TRACKED_PIDFDS,
    exit_events: bool | None = None,
    sync: Callable[[], Awaitable[None]] | None = None,
    verify_interval_s: float | None = DEFAULT_VERIFY_INTERVAL_S,
    on_missed: Callable[[], None] | None = None,
) -> Discovery:
    """Session discovery of ``home``, built from its parts (docs/design.md §5, §8).

    Args:
        home: the capsule home (docs/design.md §2).
        sample_interval_s: seconds between two sampler observations where
            something can change unannounced; then also the most age of the
            answer a ``sessions.snapshot`` without ``max_age_ms`` gets.
        totals: the daemon's counters; observations, rescans, reader restarts
            and verification runs are counted into it. New when omitted.
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
    totals = StatusTotals() if totals is None else totals
    reader = HomeReader(
        home,
        ChangeFeed() if changes is None else changes,
        totals=totals,
        descendant_pidfds=descendant_pidfds,
    )
    wakeups = Wakeups()
    sources = WakeSources(
        ExitWatch(wakeups.wake, max_pidfds=max_pidfds, enabled=exit_events),
        DescendantLooks(
            look=reader.look,
            active=reader.descendants_active,
            wake=wakeups.wake,
            owed=reader.owes_table,
        ),
        CommitWait(writing=reader.writing, wake=wakeups.wake),
    )
    verification = VerificationRuns(
        totals, interval_s=verify_interval_s, sync=sync, on_missed=on_missed
    )
    return Discovery(
        reader,
        wakeups=wakeups,
        sources=sources,
        verification=verification,
        latest=LatestAnswer(),
        watcher_mode=watcher_mode,
        sync=sync,
        sample_interval_s=sample_interval_s,
    )


class Supervisor:
    """The running daemon's composition root and its one task group (docs/design.md §8).

    It builds each service once, hands each handler only what it needs, and
    runs them all until a shutdown.

    Args:
        config: what the daemon was told at start-up.

    Attributes:
        lifecycle: the one shutdown state; ``lifecycle.exit_status`` is the
            process's exit status once :meth:`run` returns.
        discovery: session discovery (:class:`capsuled.discovery.discovery.Discovery`,
            built by :func:`build_discovery`).
        methods: the method table the dispatcher serves.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self.lifecycle = Lifecycle()
        self.totals = StatusTotals()
        # The watch feeds discovery's reader; it starts before discovery's
        # first observation, a walk: one walk to ready, and nothing written
        # meanwhile is missed.
        # docs/design.md §8: the open-file limit raised and shared out first.
        self.budget = budget.share(config.max_pidfds, config.max_connections)
        feed = ChangeFeed()
        self.watcher = HomeWatcher(
            config.home,
            feed,
            mode=config.watch,
            poll_interval_s=config.poll_interval_s,
            rescan_at_start=False,
        )
        watcher = self.watcher
        self.discovery = build_discovery(
            config.home,
            sample_interval_s=config.sample_interval_s,
            totals=self.totals,
            changes=feed,
            watcher_mode=lambda: watcher.mode,  # it may fall back to polling
            max_pidfds=self.budget.exit_pidfds,
            descendant_pidfds=self.budget.descendant_pidfds,
            sync=watcher.sync,
            verify_interval_s=config.verify_interval_s,
            on_missed=watcher.recheck,
        )
        self.subscriptions = SubscriptionHub(
            lambda: self.discovery.announced, self.totals, self.discovery.argv
        )
        self.discovery.add_listener(self.subscriptions.publish)
        self.methods = self._method_table()
        self.dispatcher = Dispatcher(
            self.methods, on_request=self._count_request, stopping=self.lifecycle.is_stopping
        )
        self.server = Server(
            self.dispatcher,
            max_connections=self.budget.connections,
            write_timeout_s=config.write_timeout_s,
            on_connect=refuse_peer,  # docs/design.md §8: a peer of another uid gets -32006
        )
        self.textfile: TextfileWriter | None = None
        if config.metrics_textfile is not None:  # docs/design.md §8
            self.textfile = TextfileWriter(config.metrics_textfile, self.metrics)
            self.discovery.add_listener(lambda _snapshot: self._mark_metrics())
        self.notifier = notify.Notifier.from_environ()

    def _method_table(self) -> dict[str, Method]:
        """Every method served (docs/design.md §7), each handler built from what it needs."""
        figures = StatusFigures(
            home=self.config.home,
            socket=lambda: self.config.socket,
            started_at=self.started_at,
            started_monotonic=self.started_monotonic,
            totals=self.totals,
            discovery=self.discovery,
            watcher=self.watcher,
            clients=lambda: self.server.clients,
            subscriptions=lambda: self.subscriptions.count,
        )
        status = status_handler(figures)
        self.metrics = DaemonCollector(
            lambda: status(NoParams()), lambda: self.discovery.latest, RequestMetrics()
        )
        reconciles = Reconciles(
            records_root(self.config.home),
            cancelled=self.lifecycle.is_stopping,
            on_report=functools.partial(count_reconcile, self.totals),
        )
        return method_table(
            {
                "ping": ping,
                "status": status,
                "metrics": metrics_handler(self.metrics),
                "sessions.snapshot": snapshot_handler(self.discovery),
                "reader.rescan": rescan_handler(self.request_rescan),
                "session.reconcile": reconciles.handle,
                "sessions.subscribe": subscribe_handler(self.subscriptions),
                "sessions.unsubscribe": unsubscribe_handler(self.subscriptions),
                "session.terminate": terminate_handler(
                    fresh_session_processes(self.discovery), self.totals, self.discovery.argv
                ),
            }
        )

    def _count_request(self, method: str, outcome: int | None, duration_s: float) -> None:
        self.totals.requests += 1
        if outcome is not None:
            self.totals.errors += 1
        self.metrics.requests.observe(method, outcome, duration_s)
        self._mark_metrics()

    def _mark_metrics(self) -> None:
        if self.textfile is not None:
            self.textfile.mark()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (what SIGTERM and SIGINT do)."""
        self.lifecycle.request_shutdown()

    def request_rescan(self) -> None:
        """Schedule a full rescan (what SIGHUP and ``reader.rescan`` do)."""
        log.info("rescan requested")
        self.discovery.request_rescan()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`request_shutdown`; then drain and clean up.

        Raises:
            StartupError: the home or the socket cannot be set up.
        """
        _route_event_loop_errors()
        made_home: list[Path] = []
        try:
            made_home = ensure_home(self.config.home)  # docs/design.md §3 strictness
            listening = sockets.open_listener(self.config.socket)  # lock, then socket
        except ServiceError as exc:
            remove_made_dirs(made_home)  # a refused start leaves nothing behind (§8)
            raise StartupError(str(exc)) from exc
        except OSError as exc:
            remove_made_dirs(made_home)
            if not is_shortage(exc):
                raise
            raise StartupError(shortage_gap(exc.errno, retrying=False)) from exc
        ready = False
        if listening.path != self.config.socket:
            self.config = dataclasses.replace(self.config, socket=listening.path)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_signals)
                tg.start_soon(notify.send_watchdog, self.notifier)
                # The watch first, so that discovery's first observation (a
                # walk) reads everything written from then on: one walk to
                # ready. Both start before the server: no request can find
                # discovery not running.
                await tg.start(self.watcher.serve)
                await tg.start(self.discovery.serve)
                await tg.start(self.subscriptions.serve)
                listener = UnixListener(listening.sock)
                await tg.start(self.server.serve, listener)
                if self.textfile is not None:
                    await tg.start(self.textfile.serve)
                if not listening.activated:  # systemd's socket is systemd's to keep
                    tg.start_soon(
                        functools.partial(
                            sockets.keep_listening,
                            listening,
                            rebound=listener.replace,
                            taken=lambda: self.lifecycle.request_shutdown(exit_status=1),
                        )
                    )
                log.info(
                    "capsuled ready",
                    pid=os.getpid(),
                    socket=str(self.config.socket),
                    home=str(self.config.home),
                    socket_activated=listening.activated,
                )
                if self.notifier.address is not None:
                    tg.start_soon(
                        functools.partial(
                            notify.tell_service_manager,
                            self.notifier,
                            first_observation=self.discovery.first_observation,
                            latest=lambda: self.discovery.latest,
                            next_answer=self.discovery.next_answer,
                            watcher_mode=lambda: self.watcher.mode,
                        )
                    )
                task_status.started()
                ready = True
                await self.lifecycle.stopping()
                self.notifier.stopping("shutting down: finishing requests in flight")
                await self._drain()
                tg.cancel_scope.cancel()
        finally:
            # Removes only a socket the daemon created, then unlocks; a start that
            # failed before it served removes the lock file and directories it made.
            listening.close(refused=not ready)
            if not ready:
                remove_made_dirs(made_home)
            self.notifier.close()
            log.info("capsuled stopped")

    async def _drain(self) -> None:
        """Carry the lifecycle's shutdown to each service, then wait for requests in flight.

        The dispatcher reads the lifecycle and answers new requests -32005;
        discovery ends its long polls and the server stops accepting, each
        told here, once, through its own interface.
        """
        log.info("shutting down", in_flight=sum(c.busy for c in self.server.connections))
        # A long poll waits for a change that may not come before its timeout:
        # answered -32005 now, it does not hold the drain (nor do subscriptions:
        # their connections are idle between requests, and close_idle ends them).
        self.discovery.end_long_polls()
        self.server.stop_accepting()
        self.server.close_idle()
        with anyio.move_on_after(self.config.drain_timeout_s):
            await self.server.wait_closed()
        if self.server.connections:
            log.warning(
                "drain timeout passed; cancelling requests",
                cancelled=len(self.server.connections),
                drain_timeout_s=self.config.drain_timeout_s,
            )
            self.server.close_all()

    async def _read_signals(self) -> None:
        with open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    log.info("SIGHUP: scheduling a rescan")
                    self.request_rescan()
                else:
                    log.info("signal received; shutting down", signal=signal.Signals(signum).name)
                    self.request_shutdown()


def _route_event_loop_errors() -> None:
    """Send what asyncio reports from callbacks to the structured log."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        log.warning(
            "event loop reported an error",
            message=context.get("message"),
            error=repr(exc) if exc is not None else None,
        )

    try:
        asyncio.get_running_loop().set_exception_handler(handler)
    except RuntimeError:  # not on asyncio
        pass
