"""The real daemon: requests for methods whose handlers are plain functions (``ping``,
``status``), counted, logged and drained like the others."""

from __future__ import annotations

import array
import fcntl
import json
import signal
import socket
import termios
from pathlib import Path

from helpers.daemon import DaemonProcess
from helpers.waits import wait_until


def _status_line(id: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"status"}\n' % id


def test_status_totals_count_requests_of_plain_function_handlers(daemon: DaemonProcess) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(daemon.socket_path))
        reader = sock.makefile("rb")

        def ask(line: bytes) -> dict[str, object]:
            sock.sendall(line)
            reply: dict[str, object] = json.loads(reader.readline())
            return reply

        before = ask(_status_line(0))["result"]["totals"]  # type: ignore[index]
        sock.sendall(
            b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
            b'{"jsonrpc":"2.0","method":"ping"}\n'  # a notification: counted, not answered
            b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":1}}\n'  # an error
        )
        assert json.loads(reader.readline())["id"] == 1
        assert json.loads(reader.readline())["error"]["code"] == -32602
        after = ask(_status_line(3))["result"]["totals"]  # type: ignore[index]
    # status 0 itself, then the three pings.
    assert after["requests"] - before["requests"] == 4
    assert after["errors"] - before["errors"] == 1
    logged = [
        json.loads(line)
        for line in daemon.logs().splitlines()
        if line.startswith("{") and '"event":"request"' in line
    ]
    # status 0, the three pings, status 3 (logged before its reply is sent).
    last = [(entry["method"], entry["outcome"], entry["notification"]) for entry in logged[-5:]]
    assert last == [
        ("status", "ok", False),
        ("ping", "ok", False),
        ("ping", "ok", True),
        ("ping", -32602, False),
        ("status", "ok", False),
    ]


def _queued(sock: socket.socket) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


def test_sigterm_while_a_status_reply_waits_for_a_stuck_reader(short_dir: Path) -> None:
    """A client that stops reading in the middle of status replies, and an idle client:
    the daemon stops (its 1 s write timeout drops the stuck one), every line received is
    whole and in order, and nothing reaches the event loop's handler."""
    home = short_dir / "home"
    home.mkdir(mode=0o700)
    with DaemonProcess(home, short_dir / "d.sock", ["--write-timeout", "1"]) as daemon:
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with stuck, idle:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.settimeout(10)
            idle.settimeout(10)
            stuck.connect(str(daemon.socket_path))
            idle.connect(str(daemon.socket_path))
            stuck.sendall(b"".join(_status_line(n) for n in range(1500)))
            wait_until(lambda: _queued(stuck) > 0, timeout_s=10, message="replies to queue")
            daemon.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            status = daemon.process.wait(timeout=10)  # type: ignore[union-attr]
            assert idle.recv(100) == b""  # ended by close_idle
            received = b""
            while chunk := stuck.recv(65536):
                received += chunk
    assert status == 0
    lines = received.split(b"\n")
    whole = [json.loads(line) for line in lines[:-1]]
    assert [reply["id"] for reply in whole] == list(range(len(whole)))
    # Answered, or refused as the daemon shuts down (-32005), never anything else.
    assert all(
        "totals" in reply["result"] if "result" in reply else reply["error"]["code"] == -32005
        for reply in whole
    ), [reply for reply in whole if "result" not in reply]
    logs = daemon.logs()
    assert "Traceback" not in logs and "event loop" not in logs.lower(), logs[-3000:]
