"""``session.reconcile``: mark and report what a prior session left (docs/design.md §6)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
import structlog

from capsule_client.wire import LostReport, ReconcileParams
from capsuled.errors import InternalError
from capsuled.reconcile.prior_session import reconcile_marking

__all__ = ["RECONCILE_THREADS", "Reconciles"]

log = structlog.get_logger("capsuled.handlers")

#: Reconciles that may hold a worker thread at once. A reconcile may wait up
#: to 10 s in its thread for a trace another process holds locked; without a
#: bound of their own, a burst of them took every thread of anyio's default
#: pool (40) and observations waited for one.
RECONCILE_THREADS: Final = 4


class Reconciles:
    """The ``session.reconcile`` handler, with its thread limiter and its trace turns.

    Args:
        records_root: ``<home>/sessions``, where the traces are.
        cancelled: whether the daemon is stopping (read from the worker thread).
        on_report: called with each reconcile's answer (the report, or ``None``, and
            whether it marked anything now), for the counts.
    """

    def __init__(
        self,
        records_root: Path,
        *,
        cancelled: Callable[[], bool],
        on_report: Callable[[LostReport | None, bool], None] = lambda _report, _marked: None,
    ) -> None:
        self._records_root = records_root
        self._cancelled = cancelled
        self._on_report = on_report
        self._limiter = anyio.CapacityLimiter(RECONCILE_THREADS)
        # from_session -> its lock: one reconcile per trace at a time in this
        # daemon, the others waiting without a thread. Dropped when unused.
        self._trace_turns: dict[str, anyio.Lock] = {}

    async def handle(self, params: ReconcileParams) -> LostReport | None:
        """Mark and report what ``params.from_session`` left.

        The scan and the append run in a worker thread
        (:func:`capsuled.reconcile.prior_session.reconcile` raises the RPC errors: -32602,
        -32003, -32004, -32603). Once started, a reconcile is not abandoned
        on cancellation: its markers and its report belong together.

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
                reconciled = await anyio.to_thread.run_sync(
                    functools.partial(
                        reconcile_marking,
                        self._records_root,
                        params.from_session,
                        params.this_session,
                        params.context_id,
                        cancelled=self._cancelled,
                    ),
                    limiter=self._limiter,
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
        self._on_report(reconciled.report, reconciled.marked)
        report = reconciled.report
        if report is not None:
            log.info(
                "reconciled lost work",
                from_session=params.from_session,
                this_session=params.this_session,
                task_id=report.task_id,
                lost=[work.work_id for work in report.lost],
                trust=report.provenance.trust,
                repeated=not reconciled.marked,
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
