"""The supervisor: one anyio task group and the daemon's lifecycle (SPEC §8).

Start-up binds the socket, starts each service with ``tg.start`` (so a bind
error reaches the caller and "ready" means ready): session discovery (the
reader and its sampler, :mod:`capsuled.discovery`), then the server; then it
waits for a shutdown.
Shutdown: stop accepting, close idle connections, let in-flight requests
finish for up to ``drain_timeout_s``, cancel the rest (a running observation
stops between two file reads), remove the socket.
Signal handlers only set state: one task reads the signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from capsule_client.protocol import DiscoveryCost, DiscoveryState, StatusTotals, WatcherMode

from .api import Api
from .config import Config
from .discovery import Discovery
from .jsonrpc import Dispatcher
from .server import Server, bind_unix_listener
from .watcher import HomeWatcher

__all__ = ["Daemon", "StartupError"]

log = structlog.get_logger("capsuled")


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
        )
        self.feed = self.sessions.changes
        self.watcher = HomeWatcher(
            config.home,
            self.feed,
            mode=config.watch,
            off_rescan_interval_s=config.sample_interval_s,
            rescan_interval_s=config.rescan_interval_s,
        )
        self.notes: list[str] = []  # remarks for status, beside discovery's own
        self.api = Api(self)
        self.dispatcher = Dispatcher(self.api.methods(), on_request=self._count_request)
        self.server = Server(self.dispatcher, max_connections=config.max_connections)
        self._shutdown = anyio.Event()

    @property
    def watcher_mode(self) -> WatcherMode:
        """What the watcher does now (``status.watcher``): it may have fallen back to polling."""
        return self.watcher.mode

    def _count_request(self, method: str, outcome: int | None) -> None:
        self.totals.requests += 1
        if outcome is not None:
            self.totals.errors += 1

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (what SIGTERM and SIGINT do)."""
        self._shutdown.set()

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
        self._prepare_home()
        try:
            listener = await bind_unix_listener(self.config.socket)
        except OSError as exc:
            raise StartupError(f"cannot listen on {self.config.socket}: {exc}") from exc
        socket_identity = _identity(self.config.socket)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_signals)
                # Discovery first: it is started at once (its first observation
                # follows), so no request can find it not running. The watcher
                # owes a rescan when its watch starts.
                await tg.start(self.sessions.serve)
                await tg.start(self.watcher.serve)
                await tg.start(self.server.serve, listener)
                log.info(
                    "capsuled ready",
                    pid=os.getpid(),
                    socket=str(self.config.socket),
                    home=str(self.config.home),
                )
                task_status.started()
                await self._shutdown.wait()
                await self._drain()
                tg.cancel_scope.cancel()
        finally:
            if socket_identity is not None and _identity(self.config.socket) == socket_identity:
                self.config.socket.unlink(missing_ok=True)
            log.info("capsuled stopped")

    def _prepare_home(self) -> None:
        home = self.config.home
        try:
            home.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"cannot create the home {home}: {exc}") from exc
        if not home.is_dir():
            raise StartupError(f"the home {home} is not a directory")

    async def _drain(self) -> None:
        log.info("shutting down", in_flight=sum(c.busy for c in self.server.connections))
        self.dispatcher.shutting_down = True
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


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
