"""``session.terminate``: end every live process of a session (docs/design.md §7).

The handler asks discovery for the session's processes in a fresh
observation, hands them to :func:`capsuled.processes.terminate.terminate` (pidfds, the
grace, then ``SIGKILL``), lets it ask again during the grace for processes
that appeared since, and counts the outcomes. With ``ended_only`` it touches
a session only while it is ended (docs/design.md §13): every process it
lists is then a descendant, since a session with a receipt's or an owned
row's process is running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from capsule_client.wire import SnapshotParams, StatusTotals, TerminateParams, TerminateReport
from capsuled.common.shortage import is_shortage, shortage_gap
from capsuled.discovery.discovery import Discovery
from capsuled.errors import DiscoveryUnavailable, NoSuchSession, RpcError, SessionRunning
from capsuled.metrics.collector import count_terminated
from capsuled.processes.argv import ArgvCache
from capsuled.processes.commands import with_target_commands
from capsuled.processes.terminate import Target, terminate

__all__ = [
    "SessionProcesses",
    "ended",
    "fresh_session_processes",
    "roots_first",
    "terminate_handler",
]

log = structlog.get_logger("capsuled.handlers")

#: A session's live processes in a fresh observation, None when it is not active
#: (:func:`fresh_session_processes`).
SessionProcesses = Callable[[str], Awaitable[list[Target] | None]]


def fresh_session_processes(discovery: Discovery) -> SessionProcesses:
    """``session_id`` → its live processes in a fresh observation (docs/design.md §7).

    Fresh as ``sessions.snapshot {"max_age_ms": 0}`` (read-your-writes):
    receipt processes, owned rows and descendants, each with the start
    the observation's sample read, its ticks and its time (a receipt's
    ``started_at`` may differ from that time by up to the receipt's
    tolerance, or by a clock step where it carries its exact identity,
    docs/design.md §14). None when the session is not active.

    The returned coroutine raises ``DiscoveryUnavailable`` (the observation is
    ``unavailable``, still ``scanning`` at its timeout, or late),
    ``ShuttingDown`` and ``InternalError`` as ``sessions.snapshot`` does.
    """

    async def session_processes(session_id: str) -> list[Target] | None:
        snapshot = await discovery.snapshot(SnapshotParams(max_age_ms=0))
        if snapshot.discovery != "ready":
            reason = snapshot.gaps[-1] if snapshot.gaps else "no reason given"  # the state's own
            raise DiscoveryUnavailable(f"discovery {snapshot.discovery}: {reason}")
        sampled = discovery.sampled_starts(snapshot.observed_at)
        for session in snapshot.sessions:
            if session.session_id == session_id:
                targets = []
                for p in session.processes:
                    start = sampled.get(p.pid)
                    targets.append(
                        Target(
                            p.pid,
                            p.started_at,
                            p.kind,
                            None if start is None else start.s,
                            parent_pid=p.parent_pid,
                            root_pid=p.root_pid,
                            start_ticks=None if start is None else start.ticks,
                        )
                    )
                return targets
        return None

    return session_processes


def terminate_handler(
    session_processes: SessionProcesses, totals: StatusTotals, argv: ArgvCache | None = None
) -> Callable[[TerminateParams], Awaitable[TerminateReport]]:
    """The ``session.terminate`` handler.

    Args:
        session_processes: the session's processes now, from a fresh observation
            (read-your-writes), each with the start time its sample read.
        totals: the daemon's counters; each reported outcome is counted
            (``terminated_<outcome>``, ``capsuled_terminated_processes_total``).
        argv: where ``commands: true`` reads each process's argv, before the
            first signal (docs/design.md §5); None: a cache of its own.

    The handler raises ``NoSuchSession`` (-32007) when the session is not
    active in the fresh observation (with ``ended_only``: ``SessionRunning``,
    -32007 too, when it is running), ``DiscoveryUnavailable`` (-32001) when
    that observation could not say. Once signalling has begun, an
    observation that fails during the grace only means no new processes
    are found: the report still comes; with ``ended_only``, so does one that
    finds the session running again.
    """

    cache = ArgvCache() if argv is None else argv

    async def named(targets: list[Target], commands: bool) -> list[Target]:
        return await with_target_commands(targets, cache) if commands else targets

    async def handle(params: TerminateParams) -> TerminateReport:
        session_id = params.session_id
        targets = await session_processes(session_id)
        if targets is None:
            raise NoSuchSession(session_id)
        if params.ended_only and not ended(targets):
            raise SessionRunning(session_id)
        targets = await named(targets, params.commands)

        async def more() -> list[Target]:
            try:
                found = await session_processes(session_id) or []
            except RpcError as exc:  # unavailable, late, stopping: the ones known still end
                log.debug("no fresh observation during the grace", error=exc.message)
                return []
            if params.ended_only and not ended(found):
                return []  # it runs again: what it runs now is not a leftover
            return roots_first(await named(found, params.commands))

        try:
            report = await terminate(
                session_id,
                roots_first(targets),
                signal_name=params.signal,
                grace_s=params.grace_ms / 1000,
                more=more,
                spare=[(spared.pid, spared.started_at) for spared in params.spare],
            )
        except OSError as exc:  # before any signal: the daemon's shortage (docs/design.md §8)
            if not is_shortage(exc):
                raise
            raise DiscoveryUnavailable(
                f"nothing was signalled: {shortage_gap(exc.errno, retrying=False)}"
            ) from exc
        count_terminated(totals, (process.outcome for process in report.processes))
        return report

    return handle


def ended(targets: list[Target]) -> bool:
    """Whether a session listing ``targets`` is ended: only descendants are left
    (docs/design.md §13, the projection's rule)."""
    return all(target.kind == "descendant" for target in targets)


def roots_first(targets: list[Target]) -> list[Target]:
    """The receipt processes and owned rows before the descendants, each in listed order.

    Signalled in this order: a shell whose child got the signal first may
    exit on its own (its ``wait`` returned) before its turn, and would be
    reported ``gone`` instead of running its ``TERM`` trap.
    """
    return sorted(targets, key=lambda target: target.kind == "descendant")
