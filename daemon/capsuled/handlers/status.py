"""``ping`` and ``status``: who the daemon is, what it watches, what it did (docs/design.md §7)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec

from capsule_client.wire import (
    ActiveSessionsSnapshot,
    ExitWatchMode,
    NoParams,
    PingResult,
    StatusResult,
    StatusTotals,
    VerificationStatus,
    WatcherMode,
    WatchStatus,
)
from capsuled import __version__

__all__ = [
    "DiscoveryFigures",
    "ExitFigures",
    "StatusFigures",
    "WatcherFigures",
    "ping",
    "status_handler",
]


def ping(params: NoParams) -> PingResult:
    """``ping`` → ``{"pong": true, "version": ...}``."""
    return PingResult(pong=True, version=__version__)


class ExitFigures(Protocol):
    """What ``status`` shows of the exit watch (:class:`capsuled.processes.exits.ExitWatch`)."""

    @property
    def mode(self) -> ExitWatchMode: ...
    @property
    def held(self) -> int: ...
    @property
    def unwatched(self) -> int: ...


class DiscoveryFigures(Protocol):
    """What ``status`` shows of session discovery (``Discovery``, :mod:`capsuled.discovery`)."""

    @property
    def latest(self) -> ActiveSessionsSnapshot | None: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def long_polls(self) -> int: ...
    @property
    def verification(self) -> VerificationStatus: ...
    @property
    def exits(self) -> ExitFigures: ...


class WatcherFigures(Protocol):
    """What ``status`` shows of the watch (:class:`capsuled.watch.watcher.HomeWatcher`)."""

    @property
    def mode(self) -> WatcherMode: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def status(self) -> WatchStatus: ...


@dataclass(frozen=True, slots=True)
class StatusFigures:
    """Where each figure of ``status`` is read, at each call.

    Attributes:
        home: the configured home.
        socket: the socket served (it may differ from the configured one
            under socket activation, so it is read when asked).
        started_at: when the daemon started, Unix seconds.
        started_monotonic: the same moment on the monotonic clock, seconds.
        totals: the daemon's counters.
        discovery: session discovery.
        watcher: the watch.
        clients: connections open now.
        subscriptions: subscriptions open now.
    """

    home: Path
    socket: Callable[[], Path]
    started_at: float
    started_monotonic: float
    totals: StatusTotals
    discovery: DiscoveryFigures
    watcher: WatcherFigures
    clients: Callable[[], int]
    subscriptions: Callable[[], int]


def status_handler(figures: StatusFigures) -> Callable[[NoParams], StatusResult]:
    """The ``status`` handler, reading ``figures`` at each call (it never waits)."""

    def status(params: NoParams) -> StatusResult:
        discovery, watcher = figures.discovery, figures.watcher
        watcher_mode = watcher.mode
        latest = discovery.latest
        verification = discovery.verification
        if watcher_mode == "off":  # no watch, no verification runs
            verification = msgspec.structs.replace(verification, interval_s=None)
        return StatusResult(
            pid=os.getpid(),
            version=__version__,
            home=str(figures.home),
            socket=str(figures.socket()),
            started_at=figures.started_at,
            uptime_s=round(time.monotonic() - figures.started_monotonic, 3),
            watcher=watcher_mode,
            discovery=None if latest is None else latest.discovery,
            last_observed_at=None if latest is None else latest.observed_at,
            last_cost=None if latest is None else latest.cost,
            totals=figures.totals,
            clients=figures.clients(),
            notes=[*discovery.notes, *watcher.notes],
            subscriptions=figures.subscriptions(),
            exit_watch=discovery.exits.mode,
            pidfds=discovery.exits.held,
            sampled=discovery.exits.unwatched,
            long_polls=discovery.long_polls,
            watch=watcher.status,
            verification=verification,
        )

    return status
