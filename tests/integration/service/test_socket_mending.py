"""A running daemon keeps its socket and lock files (docs/service.md, "One daemon per socket").

A clean-up of ``/tmp`` or ``$XDG_RUNTIME_DIR`` can remove them while the
daemon runs. It checks every ``SOCKET_CHECK_INTERVAL_S`` (2 s, :mod:`capsuled.rpc.sockets`):
a removed socket is bound again, a removed lock is taken again, a lock another daemon
took in between makes this one stop, and anything else put at the socket's
path is left alone.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess, answers_ping
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit import paths
from capsuled import startup_errors
from capsuled.rpc import lockfile, sockets

#: Two check intervals and then some: the deadline for the daemon to notice.
NOTICE_S = 10.0


@pytest.fixture
def running(short_dir: Path) -> Iterator[DaemonProcess]:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "run" / "d.sock", ["--log-level", "info"]) as daemon:
        yield daemon


def test_a_removed_socket_is_bound_again_and_open_connections_go_on(
    running: DaemonProcess,
) -> None:
    with Client(running.socket_path) as before:
        pid = before.status().pid
        running.socket_path.unlink()
        wait_until(
            lambda: answers_ping(running.socket_path), timeout_s=NOTICE_S, message="a new socket"
        )
        assert before.status().pid == pid  # the connection made before goes on
    assert stat.S_IMODE(running.socket_path.stat().st_mode) == 0o600
    assert "the socket file was removed; bound it again" in running.logs()
    assert running.stop() == 0
    assert not running.socket_path.exists()  # the new socket is removed at exit, as the first


def test_a_removed_socket_directory_is_made_again(running: DaemonProcess) -> None:
    shutil.rmtree(running.socket_path.parent)
    wait_until(
        lambda: answers_ping(running.socket_path), timeout_s=NOTICE_S, message="a new socket"
    )
    lock = paths.lock_path_for(running.socket_path)
    assert lock.read_text() == f"{running.pid}\n"
    assert stat.S_IMODE(running.socket_path.parent.stat().st_mode) == 0o700
    logs = running.logs()
    assert "the lock file was removed; locked it again" in logs
    assert "the socket file was removed; bound it again" in logs
    # The lock is held again: a second daemon for the same socket is refused.
    with pytest.raises(startup_errors.AlreadyRunning) as refused:
        lockfile.acquire_socket_lock(running.socket_path)
    assert refused.value.pid == running.pid


def test_a_daemon_whose_lock_and_socket_another_took_stops_with_status_1(
    running: DaemonProcess,
) -> None:
    """Both files removed, and a second daemon locked and bound the path first: it is theirs."""
    lock_path = paths.lock_path_for(running.socket_path)
    lock_path.unlink()
    running.socket_path.unlink()
    rival = lockfile.acquire_socket_lock(running.socket_path, pid=os.getpid())
    try:
        with sockets.bind_unix_socket(running.socket_path).sock as rival_socket:
            assert running.process is not None
            assert running.process.wait(timeout=NOTICE_S) == 1
            assert "another daemon has locked it; stopping" in running.logs()
            assert lock_path.read_text() == f"{os.getpid()}\n"  # the rival's lock is untouched
            assert running.socket_path.exists()  # and so is its socket
            assert rival_socket.fileno() >= 0
    finally:
        rival.release()


@pytest.mark.slow
def test_a_lock_held_by_another_beside_a_live_socket_is_waited_out(
    running: DaemonProcess,
) -> None:
    """A second daemon refuses to start beside this one's live socket and lets its lock go:
    this one serves on meanwhile, and takes the lock again once it is free."""
    lock_path = paths.lock_path_for(running.socket_path)
    lock_path.unlink()
    rival = lockfile.acquire_socket_lock(running.socket_path, pid=os.getpid())
    try:
        wait_until(
            lambda: "another process holds the new one; serving on" in running.logs(),
            timeout_s=NOTICE_S,
            message="the warning",
        )
        assert answers_ping(running.socket_path)
    finally:
        rival.release()
    wait_until(
        lambda: lock_path.read_text() == f"{running.pid}\n",
        timeout_s=NOTICE_S,
        message="the daemon to lock again",
    )
    # The lock file holds the pid a moment before the daemon logs that it locked.
    wait_until(
        lambda: "the lock file was removed; locked it again" in running.logs(),
        timeout_s=NOTICE_S,
        message="the relock to be logged",
    )
    assert running.logs().count("another process holds the new one") == 1
    assert running.process is not None and running.process.poll() is None


def test_something_else_at_the_socket_path_is_left_alone(running: DaemonProcess) -> None:
    running.socket_path.unlink()
    running.socket_path.write_text("not a socket\n")
    wait_until(
        lambda: "something else is at the socket's path" in running.logs(),
        timeout_s=NOTICE_S,
        message="the warning",
    )
    assert running.stop() == 0
    assert running.socket_path.read_text() == "not a socket\n"
    assert running.logs().count("something else is at the socket's path") == 1


@pytest.mark.slow
def test_a_socket_that_cannot_be_made_again_is_warned_about_then_mended(
    running: DaemonProcess,
) -> None:
    directory = running.socket_path.parent
    with Client(running.socket_path) as before:
        assert before.ping().pong  # connected
        shutil.rmtree(directory)
        directory.write_text("a file where the socket's directory was\n")
        wait_until(
            lambda: "could not mend the socket; serving the one held" in running.logs(),
            timeout_s=NOTICE_S,
            message="the warning",
        )
        assert before.ping().pong  # the connection made before goes on
        directory.unlink()
        wait_until(
            lambda: answers_ping(running.socket_path), timeout_s=NOTICE_S, message="a new socket"
        )
    assert "the socket file was removed; bound it again" in running.logs()
