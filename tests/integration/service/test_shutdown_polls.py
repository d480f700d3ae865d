"""SIGTERM ends long polls and subscriptions at once instead of draining them.

The rules are docs/design.md §7, §8.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.daemon import DaemonProcess
from helpers.waits import wait_until

from capsule_client import Client

LONG_POLL_MS = 60_000
#: The long poll's answer, and the daemon's exit, come well before the 5 s drain timeout.
PROMPT_S = 1.0


@pytest.fixture
def quiet_daemon(short_dir: Path) -> Iterator[DaemonProcess]:
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock", ["--sample-interval", "60"]) as daemon:
        yield daemon


def connect(daemon: DaemonProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(daemon.socket_path))
    return sock


def send(sock: socket.socket, id: int, method: str, params: dict[str, object]) -> None:
    message = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
    sock.sendall(json.dumps(message).encode() + b"\n")


def read_lines(sock: socket.socket) -> list[dict[str, object]]:
    """Every line the daemon sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_sigterm_answers_a_long_poll_shutting_down_and_exits_promptly(
    quiet_daemon: DaemonProcess,
) -> None:
    with Client(quiet_daemon.socket_path) as client:
        generation = client.snapshot(max_age_ms=0).generation
    with connect(quiet_daemon) as poll, connect(quiet_daemon) as subscriber:
        send(subscriber, 1, "sessions.subscribe", {})
        send(poll, 2, "sessions.snapshot", {"since": generation, "timeout_ms": LONG_POLL_MS})
        # The subscription's reply and first notification: it is open.
        data = b""
        while data.count(b"\n") < 2:
            chunk = subscriber.recv(65536)
            assert chunk, f"the subscription's connection closed early (read {data!r})"
            data += chunk
        with Client(quiet_daemon.socket_path) as client:
            status = wait_until(
                lambda: (s := client.status()).long_polls == 1 and s,
                message="the long poll to wait",
            )
            assert (status.clients, status.subscriptions) == (3, 1)
        assert quiet_daemon.process is not None
        started = time.monotonic()
        quiet_daemon.process.send_signal(signal.SIGTERM)
        (answer,) = read_lines(poll)
        answered_s = time.monotonic() - started
        assert subscriber.recv(65536) == b""  # the subscription ends with its connection
        exit_code = quiet_daemon.process.wait(timeout=10)
        exited_s = time.monotonic() - started
    assert answer["id"] == 2
    assert answer["error"] == {  # type: ignore[comparison-overlap]
        "code": -32005,
        "message": "shutting down: the long poll ends without a change",
    }
    assert answered_s < PROMPT_S, answered_s
    assert exit_code == 0
    assert exited_s < PROMPT_S + 1, exited_s
