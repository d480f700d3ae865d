"""The methods the daemon serves, one handler each (docs/design.md §7).

Each handler takes its decoded params Struct (``capsule_client.protocol``)
and returns a result Struct, or raises :class:`~capsuled.errors.RpcError`.
Blocking work never runs here: handlers hand it to worker threads. Most
handlers are coroutines; the ones that never wait (``ping``, ``status``) are
plain functions, which makes them immediate methods, answered from the
connection's reader callback (:meth:`capsuled.jsonrpc.Dispatcher.answer_now`).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import anyio
import msgspec
import structlog

from capsule_client.paths import records_root
from capsule_client.protocol import (
    METHOD_PARAMS,
    LostReport,
    MetricsResult,
    NoParams,
    PingResult,
    ReconcileParams,
    RescanResult,
    SnapshotParams,
    StatusResult,
    SubscribeParams,
    SubscribeResult,
    UnsubscribeParams,
    UnsubscribeResult,
)

from . import __version__
from .errors import InternalError
from .jsonrpc import Encoded, Handler, ImmediateHandler, Method
from .metrics import count_reconcile, exposition
from .reconcile import reconcile
from .server import Connection, current_connection

if TYPE_CHECKING:
    from .supervisor import Daemon

__all__ = ["Api"]

log = structlog.get_logger("capsuled.api")


#: Reconciles that may hold a worker thread at once. A reconcile may wait up
#: to 10 s in its thread for a trace another process holds locked; without a
#: bound of their own, a burst of them took every thread of anyio's default
#: pool (40) and observations waited for one.
RECONCILE_THREADS: Final = 4


class Api:
    """Handlers bound to one :class:`~capsuled.supervisor.Daemon`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._reconcile_limiter = anyio.CapacityLimiter(RECONCILE_THREADS)
        # from_session -> its lock: one reconcile per trace at a time in this
        # daemon, the others waiting without a thread. Dropped when unused.
        self._trace_turns: dict[str, anyio.Lock] = {}

    def methods(self) -> Mapping[str, Method]:
        """Method name → params type and handler, for the methods served now."""
        handlers: dict[str, Handler | ImmediateHandler] = {
            "ping": self.ping,
            "status": self.status,
            "sessions.snapshot": self.sessions_snapshot,
            "reader.rescan": self.reader_rescan,
            "session.reconcile": self.session_reconcile,
            "sessions.subscribe": self.sessions_subscribe,
            "sessions.unsubscribe": self.sessions_unsubscribe,
            "metrics": self.metrics,
        }
        return {name: Method(METHOD_PARAMS[name], handler) for name, handler in handlers.items()}

    def ping(self, params: NoParams) -> PingResult:
        """``ping`` → ``{"pong": true, "version": ...}`` (immediate)."""
        return PingResult(pong=True, version=__version__)

    def status(self, params: NoParams) -> StatusResult:
        """``status``: who the daemon is, what it watches, what it has done (immediate)."""
        daemon = self.daemon
        return StatusResult(
            pid=os.getpid(),
            version=__version__,
            home=str(daemon.config.home),
            socket=str(daemon.config.socket),
            started_at=daemon.started_at,
            uptime_s=round(time.monotonic() - daemon.started_monotonic, 3),
            watcher=daemon.watcher_mode,
            discovery=daemon.discovery,
            last_observed_at=daemon.last_observed_at,
            last_cost=daemon.last_cost,
            totals=daemon.totals,
            clients=daemon.server.clients,
            notes=[*daemon.notes, *daemon.sessions.notes, *daemon.watcher.notes],
            subscriptions=daemon.subscriptions.count,
            exit_watch=daemon.sessions.exits.mode,
            pidfds=daemon.sessions.exits.held,
            long_polls=daemon.sessions.long_polls,
            watch=daemon.watcher.status,
            verification=daemon.sessions.verification
            if daemon.watcher_mode != "off"
            else msgspec.structs.replace(daemon.sessions.verification, interval_s=None),
        )

    def metrics(self, params: NoParams) -> MetricsResult:
        """``metrics``: the OpenMetrics exposition (docs/design.md §7; immediate)."""
        return MetricsResult(text=exposition(self.daemon.metrics))

    async def sessions_snapshot(self, params: SnapshotParams) -> Encoded:
        """``sessions.snapshot``: active sessions and their processes (docs/design.md §5, §7).

        An ``unavailable`` observation is answered as a snapshot (not an
        error): its gaps say why. The result is the encoded
        ``ActiveSessionsSnapshot``, kept by discovery for the latest answer.

        Raises:
            ShuttingDown: the daemon stopped observing.
            InternalError: the observation failed on a defect.
        """
        connection = current_connection.get(None)
        if connection is None:
            return Encoded(await self.daemon.sessions.snapshot_json(params))
        # It may wait (an observation, or a long poll for a change): a client
        # that left must not hold its slot.
        encoded = await connection.unless_peer_leaves(
            lambda: self.daemon.sessions.snapshot_json(params)
        )
        return Encoded(encoded)

    async def sessions_subscribe(self, params: SubscribeParams) -> SubscribeResult:
        """``sessions.subscribe`` (docs/design.md §7): ``sessions.changed`` on this connection.

        Raises:
            Overloaded: this connection holds too many subscriptions.
            ShuttingDown: the daemon is stopping.
        """
        connection = _connection()
        subscription = self.daemon.subscriptions.subscribe(connection, params.since)
        log.debug("subscribed", subscription=subscription, connection=connection.number)
        return SubscribeResult(subscription=subscription)

    async def sessions_unsubscribe(self, params: UnsubscribeParams) -> UnsubscribeResult:
        """``sessions.unsubscribe``: no notification of it follows the reply.

        Returns ``unsubscribed: false`` for a subscription this connection
        does not hold (already dropped or ended, or another connection's).
        """
        done = self.daemon.subscriptions.unsubscribe(_connection(), params.subscription)
        return UnsubscribeResult(unsubscribed=done)

    def _shutting_down(self) -> bool:
        """Whether a shutdown began (read from worker threads: a plain attribute)."""
        return self.daemon.dispatcher.shutting_down

    async def reader_rescan(self, params: NoParams) -> RescanResult:
        """``reader.rescan``: the next observation walks the home from scratch."""
        self.daemon.request_rescan()
        return RescanResult(scheduled=True)

    async def session_reconcile(self, params: ReconcileParams) -> LostReport | None:
        """``session.reconcile`` (docs/design.md §6): mark and report what ``from_session`` left.

        The scan and the append run in a worker thread (:func:`capsuled.reconcile.reconcile`
        raises the RPC errors: -32602, -32003, -32004, -32603).  Once started,
        a reconcile is not abandoned on cancellation: its markers and its
        report belong together.

        Reconciles of one trace take turns in the daemon (the trace's ``flock``
        still orders them with other processes), and at most
        ``RECONCILE_THREADS`` run at once, so reconciles waiting for a trace
        that another process holds locked never take the worker threads
        that observations need.

        Returns:
            The report, or ``None`` when nothing is lost.
        """
        try:
            async with self._trace_turn(params.from_session):
                report = await anyio.to_thread.run_sync(
                    functools.partial(
                        reconcile,
                        records_root(self.daemon.config.home),
                        params.from_session,
                        params.this_session,
                        params.context_id,
                        cancelled=self._shutting_down,
                    ),
                    limiter=self._reconcile_limiter,
                )
        except InternalError as exc:
            # An expected failure (unreadable trace, failed append): a warning with its cause.
            log.warning(
                "reconcile failed",
                from_session=params.from_session,
                this_session=params.this_session,
                error=exc.message,
                cause=repr(exc.__cause__),
            )
            raise
        count_reconcile(self.daemon.totals, report)
        if report is not None:
            log.info(
                "reconciled lost work",
                from_session=params.from_session,
                this_session=params.this_session,
                task_id=report.task_id,
                lost=[work.work_id for work in report.lost],
                trust=report.provenance.trust,
            )
        return report

    @asynccontextmanager
    async def _trace_turn(self, from_session: str) -> AsyncIterator[None]:
        """Hold ``from_session``'s turn: one reconcile of a trace at a time here."""
        lock = self._trace_turns.setdefault(from_session, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            # Released to a waiter, the lock stays locked: only the last one out drops it.
            turns = lock.statistics()
            if not turns.locked and not turns.tasks_waiting:
                self._trace_turns.pop(from_session, None)


def _connection() -> Connection:
    connection = current_connection.get(None)
    if connection is None:  # only the server calls handlers
        raise InternalError("subscriptions need a connection")
    return connection
