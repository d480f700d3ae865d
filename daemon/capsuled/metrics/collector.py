"""The daemon's metrics: a Prometheus collector and its exposition (docs/design.md §7 ``metrics``).

Every figure but one is read at scrape time from what the daemon already
keeps (the ``status`` result and the latest snapshot), so nothing is counted
twice and the figures cannot drift from ``status``. The exception is the
request latency histogram, which needs one observation per request
(:meth:`RequestMetrics.observe`, called by the dispatcher).

Names follow the Prometheus conventions: the ``capsuled_`` prefix, base
units (``_seconds``, ``_bytes``), ``_total`` on counters.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
import os
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import psutil
import structlog
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.exposition import ALLOWUTF8, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from capsule_client.wire import (
    METHOD_PARAMS,
    ActiveSessionsSnapshot,
    LostReport,
    ProcessKind,
    SessionState,
    StatusResult,
    StatusTotals,
)

__all__ = [
    "LATENCY_BUCKETS_S",
    "TERMINATE_OUTCOMES",
    "DaemonCollector",
    "RequestMetrics",
    "count_reconcile",
    "count_terminated",
    "exposition",
]

log = structlog.get_logger("capsuled.metrics")

#: Upper bounds of the request latency buckets, seconds (``+Inf`` is added).
#: A local daemon answers most requests in well under a millisecond; the top
#: buckets catch observations and long polls. Each bucket is a sample per
#: method in every scrape: few of them keep the exposition cheap.
LATENCY_BUCKETS_S: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.05, 0.25, 1.0, 5.0)
#: What ``session.terminate`` reports for each process (docs/design.md §7).
TERMINATE_OUTCOMES: Final = ("exited", "killed", "gone", "refused", "spared")
#: The ``method`` label of a request naming no method the daemon serves:
#: clients choose method names, and a label must not grow with them.
OTHER_METHOD: Final = "other"
_KINDS: Final = typing.get_args(ProcessKind)
_SESSION_STATES: Final = typing.get_args(SessionState)
_DISCOVERY_STATES: Final = ("ready", "scanning", "unavailable")
_WATCH_MODES: Final = ("native", "polling", "off")
_TRUSTS: Final = ("trusted", "untrusted")
_KIND: Final = operator.attrgetter("kind")
_STATE: Final = operator.attrgetter("state")


def count_reconcile(totals: StatusTotals, report: LostReport | None, marked: bool) -> None:
    """Count one finished ``session.reconcile`` and the lost works it reported, by trust.

    A report rebuilt for a retry (``marked`` false: its markers were written
    before) counts as a reconcile, not as lost work again, so each lost work
    is counted once (docs/design.md §6, §7 ``metrics``).
    """
    totals.reconciles += 1
    if report is None or not marked:
        return
    if report.provenance.trust == "trusted":
        totals.lost_reports_trusted += 1
        totals.lost_works_trusted += len(report.lost)
    else:
        totals.lost_reports_untrusted += 1
        totals.lost_works_untrusted += len(report.lost)


def count_terminated(totals: StatusTotals, outcomes: Iterable[str]) -> None:
    """Count the processes one ``session.terminate`` reported, by outcome.

    Args:
        totals: the daemon's counters.
        outcomes: each process's ``outcome`` (one of :data:`TERMINATE_OUTCOMES`).

    Raises:
        ValueError: an outcome docs/design.md §7 does not list.
    """
    for outcome in outcomes:
        if outcome not in TERMINATE_OUTCOMES:
            raise ValueError(f"unknown terminate outcome {outcome!r}")
        name = f"terminated_{outcome}"
        setattr(totals, name, getattr(totals, name) + 1)


class RequestMetrics:
    """Requests by method and outcome, and their latency histogram.

    Labels are bounded: a method the daemon does not serve is counted as
    ``other``; the outcome is ``ok`` or the JSON-RPC error code.
    """

    def __init__(self, methods: Iterable[str] = METHOD_PARAMS) -> None:
        self._methods = frozenset(methods)
        #: (method, outcome) → requests.
        self.counts: dict[tuple[str, str], int] = {}
        #: method → [requests per bucket (not cumulative; the last is +Inf), sum of seconds].
        self._latency: dict[str, tuple[list[int], list[float]]] = {}

    def observe(self, method: str, outcome: int | None, duration_s: float) -> None:
        """Count one dispatched request (``outcome``: None or its error code) that took
        ``duration_s`` seconds."""
        if method not in self._methods:
            method = OTHER_METHOD
        key = (method, "ok" if outcome is None else str(outcome))
        self.counts[key] = self.counts.get(key, 0) + 1
        latency = self._latency.get(method)
        if latency is None:
            latency = self._latency[method] = ([0] * (len(LATENCY_BUCKETS_S) + 1), [0.0])
        latency[0][bisect.bisect_left(LATENCY_BUCKETS_S, duration_s)] += 1
        latency[1][0] += duration_s

    def families(self) -> Iterator[Metric]:
        """``capsuled_requests_total`` and ``capsuled_request_duration_seconds``."""
        requests = CounterMetricFamily(
            "capsuled_requests",
            "Requests answered (and notifications handled), by method and outcome "
            "(ok, or the JSON-RPC error code).",
            labels=("method", "outcome"),
        )
        for (method, outcome), count in sorted(self.counts.items()):
            requests.add_metric((method, outcome), count)
        yield requests
        latency = HistogramMetricFamily(
            "capsuled_request_duration_seconds",
            "How long the daemon took to answer a request, from decoding it to its reply, "
            "by method.",
            labels=("method",),
        )
        bounds = [*map(repr, LATENCY_BUCKETS_S), "+Inf"]
        for method, (counts, total) in sorted(self._latency.items()):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(bounds, counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            latency.add_metric((method,), buckets, total[0])
        yield latency


class _SnapshotFigures:
    """What one answer shows, counted once per generation (it may list many processes)."""

    def __init__(self, snapshot: ActiveSessionsSnapshot | None) -> None:
        self.snapshot = snapshot
        self.kinds = dict.fromkeys(_KINDS, 0)
        self.states = dict.fromkeys(_SESSION_STATES, 0)
        if snapshot is None:
            self.sessions = self.unowned = self.gaps = self.servers = 0
            return
        self.sessions = len(snapshot.sessions)
        self.unowned = len(snapshot.unowned)
        self.gaps = len(snapshot.gaps)
        self.servers = len(snapshot.servers)
        processes = itertools.chain.from_iterable(s.processes for s in snapshot.sessions)
        self.kinds.update(collections.Counter(map(_KIND, processes)))
        self.states.update(collections.Counter(map(_STATE, snapshot.sessions)))


class DaemonCollector(Collector):
    """Builds every family from the daemon's own figures at scrape time.

    Args:
        status: the ``status`` result now (docs/design.md §7).
        snapshot: the latest observation's answer, None before the first.
        requests: the request counters and latency histogram.
        rss_bytes: the daemon's resident memory now, bytes.
    """

    def __init__(
        self,
        status: Callable[[], StatusResult],
        snapshot: Callable[[], ActiveSessionsSnapshot | None],
        requests: RequestMetrics,
        rss_bytes: Callable[[], int] | None = None,
    ) -> None:
        self._status = status
        self._snapshot = snapshot
        self.requests = requests
        self._rss_bytes = rss_bytes if rss_bytes is not None else _own_rss()
        self._figures = _SnapshotFigures(None)

    def collect(self) -> Iterator[Metric]:
        """Every family, from one ``status`` result and one snapshot."""
        status = self._status()
        snapshot = self._snapshot()
        # The generation changes whenever the answer does (docs/design.md §7):
        # an unchanged answer is not counted again, however many processes it lists.
        if _generation(snapshot) != _generation(self._figures.snapshot):
            self._figures = _SnapshotFigures(snapshot)
        yield from _discovery_families(status, self._figures)
        yield from _work_families(status.totals)
        yield from _watch_families(status)
        yield from self.requests.families()
        yield from _service_families(status, self._rss_bytes())


def _generation(snapshot: ActiveSessionsSnapshot | None) -> int | None:
    return None if snapshot is None else snapshot.generation


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _labelled(
    family: GaugeMetricFamily | CounterMetricFamily, values: Iterable[tuple[str, float]]
) -> GaugeMetricFamily | CounterMetricFamily:
    for label, value in values:
        family.add_metric((label,), value)
    return family


def _discovery_families(status: StatusResult, figures: _SnapshotFigures) -> Iterator[Metric]:
    yield _gauge(
        "capsuled_sessions_active",
        "Agent sessions that own at least one live process, in the latest observation.",
        figures.sessions,
    )
    yield _labelled(
        GaugeMetricFamily(
            "capsuled_sessions",
            "Active sessions in the latest observation, by state: running while one of its own "
            "processes (a receipt's, an owned row's) lives, ended when only what it left behind "
            "(descendants) remains.",
            labels=("state",),
        ),
        sorted(figures.states.items()),
    )
    yield _labelled(
        GaugeMetricFamily(
            "capsuled_session_processes",
            "Live processes of the active sessions, by kind (provider_client and exec from "
            "receipts, process from the ownership store, descendant: started by one of those).",
            labels=("kind",),
        ),
        sorted(figures.kinds.items()),
    )
    yield _gauge(
        "capsuled_unowned_receipts",
        "Live processes with a receipt that no session owns, in the latest observation.",
        figures.unowned,
    )
    yield _gauge("capsuled_servers_live", "Live entries of the servers registry.", figures.servers)
    yield _gauge(
        "capsuled_gaps",
        "What the latest answer could not cover (unreadable receipts, a missing store...), "
        "as a count of its gaps.",
        figures.gaps,
    )
    yield _labelled(
        GaugeMetricFamily(
            "capsuled_discovery_state",
            "The latest observation's state: 1 for the current one of ready, scanning and "
            "unavailable, 0 for the others (all 0 before the first observation).",
            labels=("state",),
        ),
        ((state, float(state == status.discovery)) for state in _DISCOVERY_STATES),
    )


def _work_families(totals: StatusTotals) -> Iterator[Metric]:
    yield _counter(
        "capsuled_observations",
        "Observations of the home and the process table since the daemon started.",
        totals.observations,
    )
    yield _counter(
        "capsuled_walks",
        "Observations that walked the whole home from scratch (start, rescans, overflows).",
        totals.rescans,
    )
    yield _counter(
        "capsuled_readers_restarted",
        "Times the home was replaced or removed and a fresh reader started.",
        totals.readers_restarted,
    )
    yield _counter(
        "capsuled_verification_runs",
        "Verification runs: comparisons of every receipt directory and live receipt with "
        "what the watch reported.",
        totals.verifications,
    )
    yield _counter(
        "capsuled_verification_changes",
        "Changes the verification runs found that the watch had not reported "
        "(each one is a watch that missed something).",
        totals.verification_changes,
    )
    yield _counter(
        "capsuled_reconciles",
        "session.reconcile calls that finished, whether they found lost work or not.",
        totals.reconciles,
    )
    yield _labelled(
        CounterMetricFamily(
            "capsuled_lost_reports",
            "Reconciles that reported lost work, by the report's trust.",
            labels=("trust",),
        ),
        zip(_TRUSTS, (totals.lost_reports_trusted, totals.lost_reports_untrusted), strict=True),
    )
    yield _labelled(
        CounterMetricFamily(
            "capsuled_lost_works",
            "Background commands that reconciles reported lost, by the report's trust.",
            labels=("trust",),
        ),
        zip(_TRUSTS, (totals.lost_works_trusted, totals.lost_works_untrusted), strict=True),
    )
    yield _labelled(
        CounterMetricFamily(
            "capsuled_terminated_processes",
            "Processes that session.terminate signalled, by outcome (exited after the "
            "signal, killed after the grace period, gone before it, refused, or spared "
            "at the caller's request).",
            labels=("outcome",),
        ),
        ((outcome, getattr(totals, f"terminated_{outcome}")) for outcome in TERMINATE_OUTCOMES),
    )


def _watch_families(status: StatusResult) -> Iterator[Metric]:
    watch = status.watch
    yield _labelled(
        GaugeMetricFamily(
            "capsuled_watch_mode",
            "How the home is watched: 1 for the current one of native, polling and off.",
            labels=("mode",),
        ),
        ((mode, float(mode == status.watcher)) for mode in _WATCH_MODES),
    )
    yield _gauge(
        "capsuled_watch_watched_directories",
        "Directories of the home with a native watch now.",
        watch.watched_directories if watch else 0,
    )
    yield _gauge(
        "capsuled_watch_polled_directories",
        "Directories of the home polled now (all of them while polling, else the ones the "
        "native watch could not watch).",
        watch.polled_directories if watch else 0,
    )
    yield _counter(
        "capsuled_watch_overflows",
        "Kernel event queue overflows of the watch (each one cost a walk of the home).",
        watch.overflows if watch else 0,
    )


def _service_families(status: StatusResult, rss_bytes: int) -> Iterator[Metric]:
    yield _gauge("capsuled_connections", "Client connections open now.", status.clients)
    yield _gauge(
        "capsuled_subscriptions", "sessions.subscribe subscriptions open now.", status.subscriptions
    )
    yield _counter(
        "capsuled_subscriptions_dropped",
        "Subscriptions ended because their client fell too far behind.",
        status.totals.subscriptions_dropped,
    )
    yield _gauge(
        "capsuled_long_polls",
        "sessions.snapshot requests waiting for a change now.",
        status.long_polls,
    )
    yield _gauge(
        "capsuled_exit_watch_pidfds",
        "Process-exit descriptors (pidfds) the daemon holds now.",
        status.pidfds,
    )
    yield _gauge(
        "capsuled_exit_watch_sampled_processes",
        "Watched processes whose exit only the periodic sample notices.",
        status.sampled,
    )
    yield _gauge("capsuled_resident_memory_bytes", "The daemon's resident memory (RSS).", rss_bytes)
    yield _gauge(
        "capsuled_start_time_seconds",
        "When the daemon started, Unix time.",
        status.started_at,
    )
    info = GaugeMetricFamily(
        "capsuled_build_info", "The daemon's version, as a label; always 1.", labels=("version",)
    )
    info.add_metric((status.version,), 1)
    yield info


def _own_rss() -> Callable[[], int]:
    process = psutil.Process(os.getpid())
    return lambda: int(process.memory_info().rss)


def exposition(collector: Collector) -> str:
    """The OpenMetrics text of ``collector``'s families (the ``metrics`` result)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    # Every name here is a legacy Prometheus name, so the output is the same
    # with either escaping; the default one checks each sample name a
    # character at a time, ALLOWUTF8 does not.
    text: bytes = generate_latest(registry, escaping=ALLOWUTF8)  # type: ignore[no-untyped-call]
    return text.decode()
