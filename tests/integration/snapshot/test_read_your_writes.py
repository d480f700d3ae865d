"""Read-your-writes (docs/design.md §5): a snapshot asked with ``fresh=True``
(``max_age_ms: 0``) reflects every receipt, store row and exit completed before it."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess

from capsule_client import Client
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.kit.store import OwnershipStore

TRIALS = 100

MODES = pytest.mark.parametrize("mode", ["native", "polling"])


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def daemon_for(short_dir: Path, mode: str) -> DaemonProcess:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    # A long poll interval: only the barrier can make polling see a write in time.
    return DaemonProcess(home, short_dir / "d.sock", ["--watch", mode, "--poll-interval", "60"])


@MODES
def test_a_runtime_sees_its_own_receipt_and_store_row_every_time(
    short_dir: Path, mode: str, sleeper: subprocess.Popen[bytes]
) -> None:
    with daemon_for(short_dir, mode) as daemon, Client(daemon.socket_path) as client:
        home = daemon.home
        misses = []
        for n in range(TRIALS):
            session, input_id = f"ses_{n}", f"inp_{n}"
            write_provider_client_receipt(home, "run_1", input_id, "c1", sleeper.pid)
            with OwnershipStore(home / "capsule.db") as store:
                store.register_session(session)
                store.register_input(input_id, session)
            answer = client.snapshot(fresh=True)
            if answer.discovery != "ready" or session not in {
                s.session_id for s in answer.sessions
            }:
                misses.append(n)
        assert misses == []
        assert daemon.stop(signal.SIGTERM) == 0


@MODES
def test_an_exit_before_the_request_is_never_in_the_answer(short_dir: Path, mode: str) -> None:
    with daemon_for(short_dir, mode) as daemon, Client(daemon.socket_path) as client:
        for n in range(20):
            process = subprocess.Popen(["sleep", "300"])
            try:
                write_exec_receipt(daemon.home, f"exe_{n}", process.pid)
                assert [p.pid for p in client.snapshot(fresh=True).unowned] == [process.pid]
            finally:
                process.kill()
                process.wait()
            assert client.snapshot(fresh=True).unowned == []
        assert daemon.stop(signal.SIGTERM) == 0


def test_a_removed_receipt_is_gone_from_the_next_answer(
    short_dir: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    with daemon_for(short_dir, "native") as daemon, Client(daemon.socket_path) as client:
        for n in range(20):
            path = write_exec_receipt(daemon.home, f"exe_{n}", sleeper.pid)
            assert len(client.snapshot(fresh=True).unowned) == 1
            path.unlink()
            assert client.snapshot(fresh=True).unowned == []
        assert daemon.stop(signal.SIGTERM) == 0


def test_fresh_and_another_max_age_are_refused_by_the_client(short_dir: Path) -> None:
    with daemon_for(short_dir, "native") as daemon, Client(daemon.socket_path) as client:
        with pytest.raises(ValueError, match="max_age_ms"):
            client.snapshot(fresh=True, max_age_ms=100)
        assert daemon.stop(signal.SIGTERM) == 0
