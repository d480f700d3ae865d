"""The daemon's own state on the socket: the results of ``status`` and ``metrics``
(docs/design.md §7).

Unknown members in results are ignored by the client (forward compatibility).
"""

# Annotations are objects here, not strings: see the package's docstring.

from typing import Literal

import msgspec
from msgspec import Struct

from .results import DiscoveryCost, DiscoveryState

__all__ = [
    "ExitWatchMode",
    "MetricsResult",
    "StatusResult",
    "StatusTotals",
    "VerificationStatus",
    "WatchStatus",
    "WatcherMode",
]

WatcherMode = Literal["native", "polling", "off"]
ExitWatchMode = Literal["pidfd", "sampling"]


class StatusTotals(Struct):
    """Counters since the daemon started.

    Attributes:
        reconciles: ``session.reconcile`` calls that finished (lost work or not).
        lost_reports_trusted: of them, reports whose provenance is ``trusted``
            (these and the three below count a report once: a retry that gets
            the same report again does not count it again).
        lost_reports_untrusted: reports whose provenance is ``untrusted``.
        lost_works_trusted: lost works listed by the trusted reports.
        lost_works_untrusted: lost works listed by the untrusted reports.
        terminated_exited: processes ``session.terminate`` saw exit after its signal.
        terminated_killed: processes it killed after the grace period.
        terminated_gone: processes already gone when it came to them.
        terminated_refused: processes it may not signal.
        terminated_spared: processes it left alone because the caller spared them.
    """

    observations: int = 0
    rescans: int = 0
    readers_restarted: int = 0
    requests: int = 0
    errors: int = 0
    subscriptions_dropped: int = 0
    verifications: int = 0
    verification_changes: int = 0
    reconciles: int = 0
    lost_reports_trusted: int = 0
    lost_reports_untrusted: int = 0
    lost_works_trusted: int = 0
    lost_works_untrusted: int = 0
    terminated_exited: int = 0
    terminated_killed: int = 0
    terminated_gone: int = 0
    terminated_refused: int = 0
    terminated_spared: int = 0


class WatchStatus(Struct):
    """What the watch does now (``status.watch``).

    Attributes:
        mode: ``native``, ``polling`` or ``off``.
        backend: ``inotify`` (Linux), ``watchfiles`` (elsewhere), ``lstat``
            (the daemon's own poller) or ``none`` (nothing runs).
        watched_directories: directories with a native watch now.
        polled_directories: directories polled now: all of them while
            polling, the ones a native watch could not watch otherwise.
        overflows: kernel queue overflows since start (each owed a walk).
        starts: watches started since start (each restart adds one).
    """

    mode: WatcherMode
    backend: str
    watched_directories: int = 0
    polled_directories: int = 0
    overflows: int = 0
    starts: int = 0


class VerificationStatus(Struct):
    """The net under the watch (``status.verification``).

    Attributes:
        interval_s: seconds between two verification runs (``--verify-interval``);
            None when there are none (no watch: every observation walks).
        runs: verification runs since start.
        changes_found: changes the watch had not reported, found by them, in total.
        last_at: when the last run finished, Unix seconds; None before the first.
        last_changes: changes the last run found.
        last_checked: directories and candidates the last run compared.
    """

    interval_s: float | None
    runs: int = 0
    changes_found: int = 0
    last_at: float | None = None
    last_changes: int = 0
    last_checked: int = 0


class StatusResult(Struct):
    """Result of ``status`` (docs/design.md §7).

    Attributes:
        pid: the daemon's process id.
        version: the daemon's version.
        home: the home it reads, absolute.
        socket: the socket it serves.
        started_at: when it started, Unix seconds.
        uptime_s: seconds since then.
        watcher: ``native``, ``polling`` or ``off`` (no watcher running).
        discovery: the last observation's state, ``None`` before the first.
        last_observed_at: when the last observation finished, Unix seconds.
        last_cost: the last observation's cost.
        totals: counters since start.
        clients: connections open now.
        notes: plain-language remarks (e.g. why there is no observation yet).
        subscriptions: ``sessions.subscribe`` subscriptions open now.
        exit_watch: how process exits are noticed: ``pidfd`` (every watched
            process has a descriptor that wakes discovery when it exits) or
            ``sampling`` (the periodic sample notices some or all of them:
            ``sampled`` says how many).
        pidfds: exit descriptors held now.
        sampled: watched processes whose exit only the periodic sample
            notices (no pidfd on this system, past the pidfds' share, or the
            daemon out of descriptors); 0 from daemons before it was added.
        long_polls: ``sessions.snapshot`` requests with ``since`` waiting
            for a change now.
        watch: the watch's backend, watched and polled directories, overflows.
        verification: the verification runs and what they found.
    """

    pid: int
    version: str
    home: str
    socket: str
    started_at: float
    uptime_s: float
    watcher: WatcherMode
    discovery: DiscoveryState | None
    last_observed_at: float | None
    last_cost: DiscoveryCost | None
    totals: StatusTotals
    clients: int
    notes: list[str] = msgspec.field(default_factory=list)
    subscriptions: int = 0
    exit_watch: ExitWatchMode = "sampling"
    pidfds: int = 0
    sampled: int = 0
    long_polls: int = 0
    watch: WatchStatus | None = None
    verification: VerificationStatus | None = None


class MetricsResult(Struct):
    """Result of ``metrics``: the OpenMetrics text exposition of the daemon's figures
    (docs/design.md §7), ending ``# EOF``."""

    text: str
