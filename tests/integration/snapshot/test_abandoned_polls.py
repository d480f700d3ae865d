"""A client that leaves during a long poll frees its connection (docs/design.md §7 ``since``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client
from capsule_client.kit.receipts import write_provider_client_receipt
from capsule_client.wire import MAX_MESSAGE_BYTES


@contextmanager
def long_poll(
    daemon: DaemonProcess, generation: int, *, timeout_ms: int
) -> Iterator[socket.socket]:
    """A connection of its own that has sent ``sessions.snapshot`` with ``since`` (id 1)."""
    poll = {"since": generation, "timeout_ms": timeout_ms}
    request = {"jsonrpc": "2.0", "id": 1, "method": "sessions.snapshot", "params": poll}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(daemon.socket_path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        yield sock


def test_long_polls_abandoned_by_their_clients_free_their_slots(short_dir: Path) -> None:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "p.sock", ["--max-connections", "3"]) as daemon:
        with Client(daemon.socket_path) as client:
            generation = client.snapshot(max_age_ms=0).generation
        for _ in range(3):  # as many as the daemon serves at once
            with long_poll(daemon, generation, timeout_ms=3_600_000):
                pass  # closed at once: nobody waits for these answers

        def served() -> bool:
            try:
                with Client(daemon.socket_path, timeout_s=2) as client:
                    return client.status().clients == 1
            except Exception:
                return False

        wait_until(served, message="the abandoned polls to end")
        assert "peer left during a request" in daemon.logs()


def test_a_client_that_only_half_closes_still_gets_its_long_poll_answered(
    daemon: DaemonProcess,
) -> None:
    with Client(daemon.socket_path) as client:
        generation = client.snapshot(max_age_ms=0).generation
    with long_poll(daemon, generation, timeout_ms=800) as sock:
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    answer = json.loads(reply)
    assert answer["id"] == 1 and answer["result"]["generation"] == generation


@contextmanager
def waiting_long_poll(daemon: DaemonProcess, client: Client) -> Iterator[socket.socket]:
    """A connection of its own whose long poll (for an hour) waits, as ``client`` sees."""
    generation = client.snapshot(max_age_ms=0).generation
    with long_poll(daemon, generation, timeout_ms=3_600_000) as sock:
        wait_until(lambda: client.status().long_polls == 1, message="the poll to wait")
        yield sock


def assert_the_poll_ended(daemon: DaemonProcess, client: Client) -> None:
    """The poll's connection, closed by its peer, is ended: only ``client``'s is left."""
    status = wait_until(
        lambda: (s := client.status()).clients == 1 and s, message="the poll to end"
    )
    assert status.long_polls == 0
    assert "peer left during a request" in daemon.logs()


@pytest.mark.parametrize("half_close_first", [False, True], ids=["close", "half-close-then-close"])
def test_a_client_that_leaves_while_its_long_poll_waits_frees_its_slot(
    daemon: DaemonProcess, half_close_first: bool
) -> None:
    """The poll is already waiting when the peer goes: the reader's end-of-stream
    (then, after a half-close, the hang-up check) ends the connection."""
    with Client(daemon.socket_path) as client:
        with waiting_long_poll(daemon, client) as sock:
            if half_close_first:
                # Half-closed, the peer still waits for its answer (that it gets
                # it is the test above); only the close that follows ends it.
                sock.shutdown(socket.SHUT_WR)
        assert_the_poll_ended(daemon, client)


def test_a_client_that_leaves_with_a_backlog_of_unread_requests_frees_its_slot(
    daemon: DaemonProcess,
) -> None:
    """Behind the poll, as many requests as the socket takes (the daemon reads none
    while the poll waits): the peer's hang-up must still end the connection."""
    ping = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"}).encode() + b"\n"
    with Client(daemon.socket_path) as client:
        with waiting_long_poll(daemon, client) as sock:
            sock.setblocking(False)
            sent = 0
            with contextlib.suppress(BlockingIOError):
                while sent < 2 * MAX_MESSAGE_BYTES:
                    sent += sock.send(ping * 1024)
            assert sent > 0
        assert_the_poll_ended(daemon, client)


def test_the_long_poll_count_returns_to_zero_after_a_timeout_and_after_a_change(
    daemon: DaemonProcess,
) -> None:
    with Client(daemon.socket_path) as client:
        generation = client.snapshot(max_age_ms=0).generation
        timed_out = client.snapshot(since=generation, timeout_ms=200)
        assert timed_out.generation == generation
        assert client.status().long_polls == 0
        with Client(daemon.socket_path) as poller:
            answered: list[int] = []
            waiter = threading.Thread(
                target=lambda: answered.append(
                    poller.snapshot(since=generation, timeout_ms=30_000).generation
                )
            )
            waiter.start()
            try:
                wait_until(lambda: client.status().long_polls == 1, message="the poll to wait")
                # A live process's receipt (this test's own) changes the answer.
                write_provider_client_receipt(daemon.home, "run_1", "inp_1", "cli_1", os.getpid())
            finally:
                waiter.join(timeout=30)
            assert answered and answered[0] != generation
        assert client.status().long_polls == 0
