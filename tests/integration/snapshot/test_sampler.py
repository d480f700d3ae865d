"""When the daemon observes with nobody asking: only where changes cannot all be events
(docs/design.md §8 "An idle daemon sleeps")."""

from __future__ import annotations

import time
from pathlib import Path

from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client


def test_an_idle_daemon_observes_nothing_nobody_asked_for(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with (
        DaemonProcess(home, short_dir / "s.sock", args=["--sample-interval", "0.05"]) as daemon,
        Client(daemon.socket_path) as client,
    ):
        wait_until(lambda: client.status().discovery == "ready", message="the first answer")
        first = client.status().totals.observations
        # Twenty sample intervals: a sampler on a timer would observe about twenty times.
        time.sleep(1.0)
        assert client.status().totals.observations == first


def test_without_a_watch_observations_follow_the_sample_interval(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    args = ["--sample-interval", "0.2", "--watch", "off"]
    with (
        DaemonProcess(home, short_dir / "s.sock", args=args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        first = client.status().totals.observations
        started = time.monotonic()
        wait_until(
            lambda: client.status().totals.observations >= first + 5,
            timeout_s=5,
            message="five observations nobody asked for",
        )
        elapsed_s = time.monotonic() - started
        # Five intervals of 0.2 s cannot pass in under 0.8 s (first one may be due at once).
        assert elapsed_s >= 0.6, elapsed_s
        status = client.status()
        assert status.last_observed_at is not None
        assert time.time() - status.last_observed_at < 2.0


def test_a_plain_snapshot_is_the_latest_answer_however_old_while_events_keep_it(
    short_dir: Path,
) -> None:
    """Without ``max_age_ms`` the answer events keep current serves at any age: its
    ``observed_at`` is older than the sample interval (docs/design.md §7)."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    args = ["--sample-interval", "0.1"]
    with (
        DaemonProcess(home, short_dir / "s.sock", args=args) as daemon,
        Client(daemon.socket_path) as client,
    ):
        first = client.snapshot()
        assert first.discovery == "ready"
        assert client.status().watch.mode == "native"
        # Five sample intervals pass, as the daemon's clock says.
        wait_until(lambda: time.time() - first.observed_at > 0.5, message="0.5 s to pass")
        later = client.snapshot()
        assert (later.observed_at, later.generation) == (first.observed_at, first.generation)
        # With max_age_ms the same request observes again.
        assert client.snapshot(max_age_ms=100).observed_at > first.observed_at
