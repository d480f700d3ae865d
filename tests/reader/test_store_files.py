"""A store path that is not a regular file makes ownership unavailable, never a hang.

The rules are docs/design.md §4.

SQLite opens the store (and its ``-wal`` / ``-shm`` / ``-journal`` files) by
path with a blocking ``open``: a FIFO there would hold the observation, every
snapshot after it and the daemon's shutdown for as long as nobody writes to it.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess

from capsule_client import Client
from capsule_client.kit.store import OwnershipStore
from capsuled.reader.store import OwnershipReader, StoreUnavailable


def ownership_within(reader: OwnershipReader, timeout_s: float) -> BaseException | None:
    """Ask the reader in a thread; the exception it raised, None if it answered."""
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            reader.session_process_ownership(["inp_a"], ["exe_a"], [os.getpid()])
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        for fifo in reader.path.parent.iterdir():
            if fifo.is_fifo():  # let the blocked open go, so the thread ends
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        pytest.fail("the ownership query blocked on a FIFO")
    return outcome[0]


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_a_fifo_at_the_store_or_beside_it_is_unavailable_at_once(
    tmp_path: Path, suffix: str
) -> None:
    store = tmp_path / "capsule.db"
    if suffix:
        with OwnershipStore(store) as writer:
            writer.register_session("ses_a")
    fifo = Path(f"{store}{suffix}")
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    error = ownership_within(OwnershipReader(store), timeout_s=3)
    assert isinstance(error, StoreUnavailable), error
    assert str(store) in str(error) and "not a regular file" in str(error)


def test_a_directory_at_the_store_is_unavailable(tmp_path: Path) -> None:
    store = tmp_path / "capsule.db"
    store.mkdir()
    error = ownership_within(OwnershipReader(store), timeout_s=3)
    assert isinstance(error, StoreUnavailable), error


def test_a_symlink_to_a_regular_store_is_read(tmp_path: Path) -> None:
    real = tmp_path / "real.db"
    with OwnershipStore(real) as writer:
        writer.register_session("ses_a")
        writer.register_input("inp_a", "ses_a")
    (tmp_path / "capsule.db").symlink_to(real)
    ownership = OwnershipReader(tmp_path / "capsule.db").session_process_ownership(
        ["inp_a"], [], []
    )
    assert ownership.inputs == {"inp_a": "ses_a"}


def test_the_daemon_answers_unavailable_and_stops_beside_a_fifo_store(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    os.mkfifo(home / "capsule.db")
    with DaemonProcess(home, short_dir / "f.sock") as daemon, Client(daemon.socket_path) as c:
        snapshot = c.snapshot(max_age_ms=0, timeout_ms=1000)
        assert snapshot.discovery == "unavailable"
        assert any("not a regular file" in gap for gap in snapshot.gaps), snapshot.gaps
        assert daemon.stop(signal.SIGTERM) == 0
