"""Scenario 14: the cost of producing the ``metrics`` text at 10k receipts and 1k connections.

The daemon's own collector (:class:`capsuled.metrics.collector.DaemonCollector`) and
exposition run in this process over what the daemon would hold: a ``status``
result with 1,000 connections and an answer listing 10,000 live receipts
(9,000 in 1,000 sessions, 1,000 unowned), with requests of every method
counted in the latency histogram. Two cases: a scrape while the answer is
unchanged (the counts of the answer are kept per generation), and the first
scrape after the answer changed (its processes are counted again).
"""

from __future__ import annotations

import msgspec

from benchmarks.harness import Context, Outcome, Table, report
from benchmarks.stats import fmt_s, summarize, time_calls
from capsule_client.wire import (
    METHOD_PARAMS,
    ActiveSessionsSnapshot,
    DiscoveryCost,
    Session,
    SessionProcess,
    StatusResult,
    StatusTotals,
    WatchStatus,
)
from capsuled.metrics.collector import DaemonCollector, RequestMetrics, exposition

__all__ = ["run"]


def _answer(receipts: int, sessions: int) -> ActiveSessionsSnapshot:
    processes = [
        SessionProcess(
            kind="exec" if n % 3 else "provider_client",
            pid=10_000 + n,
            started_at=1_700_000_000,
            receipt=f"runtime/exec-processes/exe_{n}.json",
        )
        for n in range(receipts)
    ]
    owned = receipts * 9 // 10
    per_session = owned // sessions
    return ActiveSessionsSnapshot(
        home="/home/u/.local/state/capsule",
        observed_at=1_700_000_000.0,
        generation=1,
        task=None,
        discovery="ready",
        sessions=[
            Session(
                session_id=f"ses_{n}",
                context_id=None,
                processes=processes[n * per_session : (n + 1) * per_session],
            )
            for n in range(sessions)
        ],
        unowned=processes[owned:],
        servers=[],
        gaps=[],
        cost=DiscoveryCost(),
    )


def _status(connections: int) -> StatusResult:
    return StatusResult(
        pid=1,
        version="0",
        home="/home/u/.local/state/capsule",
        socket="/run/user/1000/capsuled.sock",
        started_at=1_700_000_000.0,
        uptime_s=1.0,
        watcher="native",
        discovery="ready",
        last_observed_at=1_700_000_000.0,
        last_cost=DiscoveryCost(),
        totals=StatusTotals(observations=1_000, requests=100_000),
        clients=connections,
        subscriptions=connections // 2,
        watch=WatchStatus(mode="native", backend="inotify", watched_directories=1_000),
    )


def run(ctx: Context) -> Outcome:
    """Time the exposition in both cases and report them (a scrape every 15 s costs
    nothing a user feels: no target)."""
    receipts = ctx.size(quick=1_000, full=10_000)
    connections = ctx.size(quick=100, full=1_000)
    calls = ctx.size(quick=50, full=2_000)
    answer = _answer(receipts, sessions=receipts // 10)
    status = _status(connections)
    requests = RequestMetrics()
    for n, method in enumerate(METHOD_PARAMS):
        for outcome in (None, -32602):
            requests.observe(method, outcome, 10.0 ** -(n % 5 + 1))
    latest = [answer]
    collector = DaemonCollector(lambda: status, lambda: latest[0], requests, lambda: 50 << 20)
    text = exposition(collector)

    unchanged = summarize(time_calls(lambda: exposition(collector), calls))

    def changed() -> None:
        latest[0] = msgspec.structs.replace(answer, generation=latest[0].generation + 1)
        exposition(collector)

    after_change = summarize(time_calls(changed, calls))
    ctx.log(
        f"14: metrics text at {receipts:,} receipts: {fmt_s(unchanged.p50_s)} "
        f"(after a change {fmt_s(after_change.p50_s)})"
    )
    rows = [
        [
            name,
            f"{receipts:,}",
            f"{connections:,}",
            fmt_s(s.p50_s),
            fmt_s(s.p99_s),
            f"{len(text):,}",
        ]
        for name, s in (("answer unchanged", unchanged), ("first after a change", after_change))
    ]
    table = Table(
        columns=["scrape", "receipts", "connections", "p50", "p99", "text bytes"],
        rows=rows,
    )
    verdicts = [
        report(
            f"metrics text at {receipts:,} receipts and {connections:,} connections",
            f"p50 {fmt_s(unchanged.p50_s)}, p99 {fmt_s(unchanged.p99_s)}",
        ),
        report("the first scrape after the answer changed", f"p50 {fmt_s(after_change.p50_s)}"),
    ]
    notes = [
        "In-process: the daemon's collector and prometheus_client's OpenMetrics exposition, "
        "over a status result and an answer of the sizes shown; no socket.",
        "Connections enter the text as one figure; receipts are counted once per answer "
        "generation, which is the second row's extra cost.",
        f"{calls} calls per row.",
    ]
    return Outcome(tables=[table], verdicts=verdicts, notes=notes)
