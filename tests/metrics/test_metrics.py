"""The metrics collector, its exposition and the textfile writer (docs/design.md §7, §8)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import anyio
import pytest
import structlog
from prometheus_client.core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import Collector

from capsule_client.wire import (
    ActiveSessionsSnapshot,
    DiscoveryCost,
    LostReport,
    LostWork,
    Provenance,
    Session,
    SessionProcess,
    StatusResult,
    StatusTotals,
    WatchStatus,
)
from capsuled.metrics.collector import (
    LATENCY_BUCKETS_S,
    DaemonCollector,
    RequestMetrics,
    count_reconcile,
    count_terminated,
    exposition,
)
from capsuled.metrics.textfile import TextfileWriter

pytestmark = pytest.mark.anyio


def status(totals: StatusTotals | None = None) -> StatusResult:
    return StatusResult(
        pid=1,
        version="9.9",
        home="/h",
        socket="/s",
        started_at=1_700_000_000.5,
        uptime_s=1.0,
        watcher="polling",
        discovery="ready",
        last_observed_at=None,
        last_cost=None,
        totals=totals or StatusTotals(),
        clients=7,
        subscriptions=2,
        watch=WatchStatus(mode="polling", backend="lstat", polled_directories=12, overflows=3),
    )


def snapshot(kinds: Iterable[str], unowned: int = 0, generation: int = 1) -> ActiveSessionsSnapshot:
    processes = [SessionProcess(kind=k, pid=100 + n, started_at=1) for n, k in enumerate(kinds)]  # type: ignore[arg-type]
    return ActiveSessionsSnapshot(
        home="/h",
        observed_at=1.0,
        generation=generation,
        task=None,
        discovery="ready",
        sessions=[Session(session_id="ses_a", context_id=None, processes=processes)],
        unowned=[SessionProcess(kind="exec", pid=9000 + n, started_at=1) for n in range(unowned)],
        servers=[],
        gaps=["one gap"],
        cost=DiscoveryCost(),
    )


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_latency_buckets_are_upper_bounds_inclusive_and_cumulative() -> None:
    requests = RequestMetrics(["ping"])
    requests.observe("ping", None, LATENCY_BUCKETS_S[0])  # exactly on a bound: counted in it
    requests.observe("ping", None, 0.003)
    requests.observe("ping", -32602, 60.0)  # past the last bound: +Inf only
    requests.observe("no.such", -32601, 0.0)
    got = samples(exposition(DaemonCollector(status, lambda: None, requests, lambda: 1)))
    bucket = "capsuled_request_duration_seconds_bucket"
    assert got[(bucket, (("le", "0.0001"), ("method", "ping")))] == 1
    assert got[(bucket, (("le", "0.0025"), ("method", "ping")))] == 1
    assert got[(bucket, (("le", "0.01"), ("method", "ping")))] == 2
    assert got[(bucket, (("le", "5.0"), ("method", "ping")))] == 2
    assert got[(bucket, (("le", "+Inf"), ("method", "ping")))] == 3
    assert got[("capsuled_request_duration_seconds_count", (("method", "ping"),))] == 3
    total = got[("capsuled_request_duration_seconds_sum", (("method", "ping"),))]
    assert math.isclose(total, 0.0001 + 0.003 + 60.0)
    # A method the daemon does not serve is "other": clients cannot grow the label set.
    assert got[("capsuled_requests_total", (("method", "other"), ("outcome", "-32601")))] == 1
    assert got[("capsuled_requests_total", (("method", "ping"), ("outcome", "ok")))] == 2
    assert got[("capsuled_requests_total", (("method", "ping"), ("outcome", "-32602")))] == 1


def test_reconciles_and_terminations_are_counted_by_trust_and_outcome() -> None:
    totals = StatusTotals()
    work = LostWork(work_id="wrk_1", binary="/bin/sh", command="sleep 9", detached_at_ms=1)
    for trust, works in (("trusted", 2), ("untrusted", 1)):
        report = LostReport(
            started_in_session="ses_a",
            lost=[work] * works,
            context_id="ctx",
            provenance=Provenance(origin="completion", trust=trust),  # type: ignore[arg-type]
            task_id="tsk",
            message="lost",
        )
        count_reconcile(totals, report, True)
        # The same report again, for a retry: a reconcile, not more lost work.
        count_reconcile(totals, report, False)
    count_reconcile(totals, None, False)
    count_terminated(totals, ["exited", "exited", "killed", "refused"])
    with pytest.raises(ValueError, match="unknown terminate outcome"):
        count_terminated(totals, ["vanished"])
    got = samples(
        exposition(DaemonCollector(lambda: status(totals), lambda: None, RequestMetrics()))
    )
    assert got[("capsuled_reconciles_total", ())] == 5
    assert got[("capsuled_lost_reports_total", (("trust", "trusted"),))] == 1
    assert got[("capsuled_lost_works_total", (("trust", "trusted"),))] == 2
    assert got[("capsuled_lost_works_total", (("trust", "untrusted"),))] == 1
    terminated = "capsuled_terminated_processes_total"
    assert got[(terminated, (("outcome", "exited"),))] == 2
    assert got[(terminated, (("outcome", "killed"),))] == 1
    assert got[(terminated, (("outcome", "gone"),))] == 0
    assert got[(terminated, (("outcome", "refused"),))] == 1


def test_snapshot_figures_follow_the_latest_snapshot() -> None:
    latest = [snapshot(["exec", "exec", "provider_client"], unowned=4)]
    collector = DaemonCollector(status, lambda: latest[0], RequestMetrics(), lambda: 4096)
    got = samples(exposition(collector))
    assert got[("capsuled_sessions_active", ())] == 1
    assert got[("capsuled_session_processes", (("kind", "exec"),))] == 2
    assert got[("capsuled_session_processes", (("kind", "provider_client"),))] == 1
    assert got[("capsuled_session_processes", (("kind", "process"),))] == 0
    assert got[("capsuled_unowned_receipts", ())] == 4
    assert got[("capsuled_gaps", ())] == 1
    assert got[("capsuled_discovery_state", (("state", "ready"),))] == 1
    assert got[("capsuled_watch_mode", (("mode", "polling"),))] == 1
    assert got[("capsuled_watch_polled_directories", ())] == 12
    assert got[("capsuled_watch_overflows_total", ())] == 3
    assert got[("capsuled_connections", ())] == 7
    assert got[("capsuled_resident_memory_bytes", ())] == 4096
    latest[0] = snapshot(["process"], generation=2)
    got = samples(exposition(collector))
    assert got[("capsuled_session_processes", (("kind", "exec"),))] == 0
    assert got[("capsuled_session_processes", (("kind", "process"),))] == 1
    assert got[("capsuled_unowned_receipts", ())] == 0


class Counting(Collector):
    """A collector that records when it was collected (each write collects once)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def collect(self) -> Iterable[Metric]:
        self.at.append(time.monotonic())
        return DaemonCollector(status, lambda: None, RequestMetrics(), lambda: 1).collect()


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        # The writer keeps no event to wait on: poll with a deadline.
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.005)


async def test_the_textfile_is_written_after_changes_at_most_every_interval(
    tmp_path: Path,
) -> None:
    path = tmp_path / "capsuled.prom"
    collector = Counting()
    writer = TextfileWriter(path, collector, min_interval_s=0.2)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.serve)
        await wait_for(lambda: writer.writes == 1)
        families = {f.name for f in parse_text(path.read_text())}
        assert "capsuled_sessions_active" in families
        for _ in range(5):  # a burst of changes: one write, after the interval
            writer.mark()
        await wait_for(lambda: writer.writes == 2)
        assert collector.at[1] - collector.at[0] >= 0.2
        # Nothing changes: no write (and no wake-up) however long it lasts.
        await anyio.sleep(0.5)
        assert writer.writes == 2
        tg.cancel_scope.cancel()
    assert os.listdir(tmp_path) == ["capsuled.prom"]  # the temp file was renamed


async def test_a_failed_write_is_logged_once_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "later" / "capsuled.prom"
    writer = TextfileWriter(path, Counting(), min_interval_s=0.01)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.serve)
            await wait_for(lambda: any("cannot write" in e["event"] for e in logs))
            await wait_for(lambda: len(writer._collector.at) >= 5)  # type: ignore[attr-defined]
            path.parent.mkdir()
            await wait_for(lambda: writer.writes == 1)
            tg.cancel_scope.cancel()
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["path"] == str(path)
    assert any(e["event"] == "metrics textfile written again" for e in logs)
    assert path.read_text().startswith("# HELP")
