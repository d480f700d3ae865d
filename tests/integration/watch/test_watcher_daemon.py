"""The real capsuled with its watcher: ``--watch`` / ``CAPSULED_WATCH`` and ``status.watcher``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.userns import user_namespaces_work, with_inotify_limit

from capsule_client import Client
from capsule_client.kit.receipts import write_exec_receipt


def status_watcher(daemon: DaemonProcess) -> str:
    with Client(daemon.socket_path) as client:
        return client.status().watcher


def make_home(short_dir: Path) -> Path:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    return home


@pytest.mark.parametrize(
    ("args", "env", "mode"),
    [
        ((), {}, "native"),
        (("--watch", "polling"), {}, "polling"),
        ((), {"CAPSULED_WATCH": "off"}, "off"),
        (("--watch", "polling"), {"CAPSULED_WATCH": "off"}, "polling"),
    ],
)
def test_status_reports_the_watch_mode(
    short_dir: Path, args: tuple[str, ...], env: dict[str, str], mode: str
) -> None:
    with DaemonProcess(make_home(short_dir), short_dir / "d.sock", args, env) as daemon:
        assert status_watcher(daemon) == mode
        assert daemon.stop(signal.SIGTERM) == 0
    watching = [
        entry
        for entry in map(json.loads, daemon.logs().splitlines())
        if entry.get("event") == "watching home"
    ]
    assert [entry["mode"] for entry in watching] == ([] if mode == "off" else [mode])


def test_sigterm_stops_the_watching_daemon_quickly(short_dir: Path) -> None:
    with DaemonProcess(make_home(short_dir), short_dir / "d.sock") as daemon:
        assert status_watcher(daemon) == "native"
        sent_at = time.monotonic()
        assert daemon.stop(signal.SIGTERM) == 0
    # Without the stop event the watch thread would hold the exit for 5 s.
    assert time.monotonic() - sent_at < 2.5


def test_help_names_the_watch_flag_and_its_variable() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "capsuled", "--help"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0
    assert "--watch MODE" in proc.stdout
    assert "[$CAPSULED_WATCH]" in proc.stdout


def test_a_bad_watch_mode_exits_2_naming_it(short_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "capsuled", "--home", str(short_dir), "--watch", "inotify"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "watch must be one of native, polling, off" in proc.stderr


class DaemonWithFewWatches(DaemonProcess):
    """capsuled in its own user namespace, where only 2 inotify watches are allowed."""

    @property
    def command(self) -> list[str]:
        return with_inotify_limit("max_inotify_watches", 2, super().command)


@pytest.mark.skipif(
    not user_namespaces_work(), reason="needs Linux user namespaces (unshare --user)"
)
def test_a_daemon_at_the_watch_limit_polls_what_it_cannot_watch(short_dir: Path) -> None:
    home = make_home(short_dir)
    for name in ("runs", "runtime/exec-processes", "sessions"):
        (home / name).mkdir(parents=True)
    with (
        DaemonWithFewWatches(home, short_dir / "d.sock") as daemon,
        Client(daemon.socket_path) as client,
    ):
        watch = client.status().watch
        assert watch is not None
        assert (watch.mode, watch.backend) == ("native", "inotify")
        assert watch.watched_directories == 2  # the home and runs
        assert watch.polled_directories >= 2  # runtime and runtime/exec-processes
        assert any("could not be watched" in note for note in client.status().notes)
        # A receipt in a polled directory is in the next read-your-writes answer.
        sleeper = subprocess.Popen(["sleep", "60"])
        try:
            write_exec_receipt(home, "exec_polled", sleeper.pid)
            answer = client.snapshot(max_age_ms=0)
            assert [p.pid for p in answer.unowned] == [sleeper.pid]
        finally:
            sleeper.kill()
            sleeper.wait()
        assert daemon.stop(signal.SIGTERM) == 0
    assert "cannot watch a directory; polling it instead" in daemon.logs()
    assert "No space left on device" in daemon.logs()


@pytest.mark.parametrize("mode", ["native", "polling"])
def test_one_walk_to_ready(short_dir: Path, mode: str) -> None:
    """The watch starts before the first walk: its answer is ready, and it is the only walk."""
    home = make_home(short_dir)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for n in range(20):
            write_exec_receipt(home, f"exe_{n}", sleeper.pid)
        with (
            DaemonProcess(home, short_dir / "d.sock", ("--watch", mode)) as daemon,
            Client(daemon.socket_path) as client,
        ):
            answer = client.snapshot()
            assert answer.discovery == "ready"
            assert len(answer.unowned) == 20
            assert client.status().totals.rescans == 1
            assert daemon.stop(signal.SIGTERM) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
