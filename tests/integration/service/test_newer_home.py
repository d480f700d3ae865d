"""A daemon meeting a home written by a newer capsuled says what to do (docs/install.md,
"Upgrade"): a store of a newer ``user_version`` makes the answer ``unavailable`` with a
gap naming the version and "upgrade capsuled"; a receipt of a newer ``schema_version``
is a gap of its own, and the rest of the answer stands."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.daemon import DaemonProcess
from capsule_client.kit.paths import store_path
from capsule_client.kit.receipts import write_exec_receipt
from capsule_client.kit.store import USER_VERSION, OwnershipStore

CAPSULECTL = (sys.executable, "-m", "capsule_client.cli")


@pytest.fixture
def home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="capn", dir="/tmp") as name:
        path = Path(name) / "home"
        path.mkdir(mode=0o700)
        yield path


def sessions(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CAPSULECTL, "--socket", str(daemon.socket_path), "sessions", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_store_of_a_newer_version_says_upgrade_capsuled(home: Path) -> None:
    with OwnershipStore(store_path(home)) as store:
        store.register_session("ses_a")
    newer = USER_VERSION + 1
    with sqlite3.connect(store_path(home)) as db:
        db.execute(f"PRAGMA user_version = {newer}")
    with DaemonProcess(home, home.parent / "d.sock") as daemon:
        done = sessions(daemon)
        assert done.returncode == 1, done.stdout
        first = done.stderr.splitlines()[0]
        assert first.startswith(
            f"capsulectl: discovery unavailable: ownership store {store_path(home)} has "
            f"user_version {newer}, newer than this capsuled reads"
        ), first
        assert "upgrade capsuled" in first
        # An older version than any written is a damaged file, not an upgrade to make.
        with sqlite3.connect(store_path(home)) as db:
            db.execute("PRAGMA user_version = -3")
        done = sessions(daemon)
        assert done.returncode == 1
        assert "has user_version -3, which no capsule writer kit writes" in done.stderr
        assert "upgrade" not in done.stderr


def test_a_receipt_of_a_newer_schema_is_a_gap_that_says_upgrade(home: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        path = write_exec_receipt(home, "exe_new", sleeper.pid, command="sleep 300")
        receipt = json.loads(path.read_text())
        path.write_text(json.dumps({**receipt, "schema_version": 2}))
        with DaemonProcess(home, home.parent / "d.sock") as daemon:
            done = sessions(daemon)
            assert done.returncode == 0, done.stderr  # the rest of the answer stands
            gap = next(line for line in done.stdout.splitlines() if "exe_new" in line)
            assert "unsupported schema_version 2 (expected 1): newer than this capsuled" in gap
            assert gap.endswith("upgrade capsuled")
    finally:
        sleeper.kill()
        sleeper.wait()
