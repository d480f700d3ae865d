"""The supervisor: one anyio task group and the daemon's lifecycle (docs/design.md §8).

Start-up binds the socket, starts each service with ``tg.start`` (so a bind
error reaches the caller and "ready" means ready): session discovery (the
reader, its sampler and the exit watch, :mod:`capsuled.discovery`), the
subscriptions it feeds (:mod:`capsuled.subscriptions`), the watcher, then
the server; then it waits for a shutdown.
Shutdown: answer long polls -32005, stop accepting, close idle connections
(subscriptions end with them), let in-flight requests finish for up to
``drain_timeout_s``, cancel the rest (a running observation stops between two
file reads), remove the socket.
Signal handlers only set state: one task reads the signals.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from typing import Final

import anyio
import structlog
from anyio.abc import TaskStatus

from capsule_client.protocol import (
    DiscoveryCost,
    DiscoveryState,
    NoParams,
    StatusTotals,
    WatcherMode,
)

from . import service
from .api import Api
from .config import Config
from .discovery import Discovery
from .jsonrpc import Dispatcher
from .metrics import DaemonCollector, RequestMetrics, TextfileWriter
from .server import Server, UnixListener
from .subscriptions import SubscriptionHub
from .watcher import HomeWatcher

__all__ = ["Daemon", "StartupError"]

log = structlog.get_logger("capsuled")

#: How often a daemon that bound its own socket checks that the socket and
#: lock files are still its own (:meth:`Daemon._keep_socket`), seconds.
SOCKET_CHECK_INTERVAL_S = 2.0
#: The longest a changed watch mode waits to reach ``STATUS=`` (sd_notify), seconds.
_STATUS_RECHECK_S: Final = 60.0
#: What the socket check may find again and again: warned about once while it lasts.
_LASTING: Final = {
    "contested": "the lock file was removed and another process holds the new one; "
    "serving on, and locking it again once it is free",
    "foreign": "something else is at the socket's path; this daemon cannot be reached "
    "through it and leaves it alone",
    "failed": "could not mend the socket; serving the one held",
}


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to do."""


class Daemon:
    """The running daemon: its configuration, its services and its counters.

    Args:
        config: what the daemon was told at start-up.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self.totals = StatusTotals()
        self.sessions = Discovery(
            config.home,
            sample_interval_s=config.sample_interval_s,
            totals=self.totals,
            watcher_mode=lambda: self.watcher.mode,
            max_pidfds=config.max_pidfds,
            sync=lambda: self.watcher.sync(),
            verify_interval_s=config.verify_interval_s,
            on_missed=lambda: self.watcher.recheck(),
        )
        self.subscriptions = SubscriptionHub(lambda: self.sessions.announced, self.totals)
        self.sessions.add_listener(self.subscriptions.publish)
        self.feed = self.sessions.changes
        # The watch starts before discovery's first observation, a walk: one
        # walk to ready, and nothing written meanwhile is missed.
        self.watcher = HomeWatcher(
            config.home,
            self.feed,
            mode=config.watch,
            poll_interval_s=config.poll_interval_s,
            rescan_at_start=False,
        )
        self.notes: list[str] = []  # remarks for status, beside discovery's own
        self.api = Api(self)
        self.dispatcher = Dispatcher(self.api.methods(), on_request=self._count_request)
        self.server = Server(
            self.dispatcher,
            max_connections=config.max_connections,
            write_timeout_s=config.write_timeout_s,
            on_connect=service.refuse_peer,  # docs/design.md §8: a peer of another uid gets -32006
        )
        self.metrics = DaemonCollector(
            lambda: self.api.status(NoParams()), lambda: self.sessions.latest, RequestMetrics()
        )
        self.dispatcher.on_timed = self._observe_request
        self.textfile: TextfileWriter | None = None
        if config.metrics_textfile is not None:  # docs/design.md §8
            self.textfile = TextfileWriter(config.metrics_textfile, self.metrics)
            self.sessions.add_listener(lambda _snapshot: self._mark_metrics())
        self.notifier = service.Notifier.from_environ()
        self._shutdown = anyio.Event()
        #: The process's exit status once :meth:`run` returns: 0, or 1 when the
        #: socket's path was taken over by another daemon.
        self.exit_status = 0

    @property
    def watcher_mode(self) -> WatcherMode:
        """What the watcher does now (``status.watcher``): it may have fallen back to polling."""
        return self.watcher.mode

    def _count_request(self, method: str, outcome: int | None) -> None:
        self.totals.requests += 1
        if outcome is not None:
            self.totals.errors += 1

    def _observe_request(self, method: str, outcome: int | None, duration_s: float) -> None:
        self.metrics.requests.observe(method, outcome, duration_s)
        self._mark_metrics()

    def _mark_metrics(self) -> None:
        if self.textfile is not None:
            self.textfile.mark()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (what SIGTERM and SIGINT do)."""
        self._shutdown.set()

    async def _tell_service_manager(self) -> None:
        """sd_notify (docs/design.md §8): ``READY=1`` once the first observation is done,
        then ``STATUS=`` whenever the one-line state changes."""
        status: str | None = None
        await self.sessions.first_observation.wait()
        while True:
            text = service.status_text(self.sessions.latest, self.watcher_mode)
            if text != status:
                if status is None:
                    self.notifier.ready(text)
                else:
                    self.notifier.status(text)
                status = text
            # Woken by a new answer; a fall back to polling shows at the next
            # one, or within a minute (an idle daemon sleeps).
            with anyio.move_on_after(_STATUS_RECHECK_S):
                await self.sessions.next_answer()

    @property
    def discovery(self) -> DiscoveryState | None:
        """The last observation's state; None before the first."""
        return self.sessions.state

    @property
    def last_observed_at(self) -> float | None:
        return self.sessions.last_observed_at

    @property
    def last_cost(self) -> DiscoveryCost | None:
        return self.sessions.last_cost

    def request_rescan(self) -> None:
        """Schedule a full rescan (what SIGHUP and ``reader.rescan`` do)."""
        log.info("rescan requested")
        self.sessions.request_rescan()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`request_shutdown`; then drain and clean up.

        Raises:
            StartupError: the home or the socket cannot be set up.
        """
        _route_event_loop_errors()
        try:
            service.ensure_home(self.config.home)  # docs/design.md §3 strictness
            listening = service.open_listener(self.config.socket)  # lock, then socket
        except service.ServiceError as exc:
            raise StartupError(str(exc)) from exc
        if listening.path != self.config.socket:
            self.config = dataclasses.replace(self.config, socket=listening.path)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_signals)
                tg.start_soon(service.send_watchdog, self.notifier)
                # The watch first, so that discovery's first observation (a
                # walk) reads everything written from then on: one walk to
                # ready. Both start before the server: no request can find
                # discovery not running.
                await tg.start(self.watcher.serve)
                await tg.start(self.sessions.serve)
                await tg.start(self.subscriptions.serve)
                listener = UnixListener(listening.sock)
                await tg.start(self.server.serve, listener)
                if self.textfile is not None:
                    await tg.start(self.textfile.serve)
                if not listening.activated:  # systemd's socket is systemd's to keep
                    tg.start_soon(self._keep_socket, listening, listener)
                log.info(
                    "capsuled ready",
                    pid=os.getpid(),
                    socket=str(self.config.socket),
                    home=str(self.config.home),
                    socket_activated=listening.activated,
                )
                if self.notifier.address is not None:
                    tg.start_soon(self._tell_service_manager)
                task_status.started()
                await self._shutdown.wait()
                self.notifier.stopping("shutting down: finishing requests in flight")
                await self._drain()
                tg.cancel_scope.cancel()
        finally:
            listening.close()  # removes only a socket the daemon created, then unlocks
            self.notifier.close()
            log.info("capsuled stopped")

    async def _keep_socket(self, listening: service.Listening, listener: UnixListener) -> None:
        """Every ``SOCKET_CHECK_INTERVAL_S``, mend the socket and lock files (docs/service.md).

        A removed socket is bound again; a removed lock is taken again. If a
        second daemon took the lock first and the socket is no longer this
        daemon's, this one stops with exit status 1 and leaves the path to it.
        What lasts (something else at the socket's path, a lock another
        process holds, a failure to mend) is warned about once while it lasts.
        """
        lasting: set[str] = set()  # what the last check found, warned about already
        while True:
            await anyio.sleep(SOCKET_CHECK_INTERVAL_S)
            if service.listening_intact(listening):
                lasting = set()
                continue
            details: dict[str, str] = {}
            try:
                done: list[str] = list(
                    await anyio.to_thread.run_sync(service.mend_listening, listening)
                )
            except service.ServiceError as exc:
                done, details = ["failed"], {"error": str(exc)}
            if "taken" in done:
                log.error(
                    "the lock file was removed and another daemon has locked it; stopping",
                    lock=str(listening.lock.path),
                )
                self.exit_status = 1
                self.request_shutdown()
                return
            if "relocked" in done:
                log.warning(
                    "the lock file was removed; locked it again", lock=str(listening.lock.path)
                )
            if "rebound" in done:
                listener.replace(listening.sock)
                log.warning(
                    "the socket file was removed; bound it again", socket=str(listening.path)
                )
            found = _LASTING.keys() & done
            for key in sorted(found - lasting):
                log.warning(
                    _LASTING[key],
                    socket=str(listening.path),
                    lock=str(listening.lock.path),
                    **details,
                )
            lasting = found

    async def _drain(self) -> None:
        log.info("shutting down", in_flight=sum(c.busy for c in self.server.connections))
        self.dispatcher.shutting_down = True
        # A long poll waits for a change that may not come before its timeout:
        # answered -32005 now, it does not hold the drain (nor do subscriptions:
        # their connections are idle between requests, and close_idle ends them).
        self.sessions.end_long_polls()
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
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
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
