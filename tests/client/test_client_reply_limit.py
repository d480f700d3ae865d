"""How the clients read replies: both draw the line at ``max_reply_bytes`` in the same
place, however the reply is split into receives, and a long reply arrives whole."""

from __future__ import annotations

import fcntl
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from capsule_client import AsyncClient, Client, ProtocolError

DEADLINE_S = 10.0
LIMIT = 4096


def _reply_of(size: int) -> bytes:
    """A reply to request 1, exactly ``size`` bytes long without its line end."""
    frame = len(msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "result": ""}))
    line = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "result": "x" * (size - frame)})
    assert len(line) == size
    return line


def _reply_of_empty() -> bytes:
    return msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "result": ""})


def _unread(sock: socket.socket) -> int:
    """Bytes this end sent that the peer has not read yet (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0])


def _wait_read(sock: socket.socket) -> None:
    """Until the client read everything sent, or closed the connection."""
    deadline = time.monotonic() + DEADLINE_S
    poll = select.poll()
    poll.register(sock, select.POLLHUP)
    while _unread(sock) and not poll.poll(0):
        assert time.monotonic() < deadline, "the client never read what was sent"
        time.sleep(0.001)


@contextmanager
def _peer(path: Path, parts: list[bytes]) -> Iterator[threading.Event]:
    """One connection: after the request line, each part is sent once the client
    read the part before it. Sets the event when the client closes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    closed = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(DEADLINE_S)
            received = b""
            while b"\n" not in received:
                received += connection.recv(65536)
            try:
                for part in parts:
                    connection.sendall(part)
                    _wait_read(connection)
                while connection.recv(65536):
                    pass
            except OSError:  # the client closed before the last part
                pass
            closed.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield closed
    finally:
        listener.close()
        thread.join(DEADLINE_S)


def _blocking_ping(path: Path) -> bytes:
    with Client(path, timeout_s=DEADLINE_S, max_reply_bytes=LIMIT) as client:
        return client.call_raw("ping")


def _async_ping(path: Path) -> bytes:
    async def main() -> bytes:
        async with AsyncClient(path, timeout_s=DEADLINE_S, max_reply_bytes=LIMIT) as client:
            return await client.call_raw("ping")

    return anyio.run(main)


CLIENTS: dict[str, Callable[[Path], bytes]] = {"blocking": _blocking_ping, "async": _async_ping}


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
@pytest.mark.parametrize(
    "split", [None, LIMIT - 1, LIMIT], ids=["one-receive", "split-before-the-end", "line-end-alone"]
)
def test_a_reply_of_exactly_the_limit_is_accepted(
    short_dir: Path, client: Callable[[Path], bytes], split: int | None
) -> None:
    line = _reply_of(LIMIT) + b"\n"
    parts = [line] if split is None else [line[:split], line[split:]]
    with _peer(short_dir / "p.sock", parts):
        result = client(short_dir / "p.sock")
    assert msgspec.json.decode(result) == "x" * (LIMIT - len(_reply_of_empty()))


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
def test_a_reply_one_byte_past_the_limit_is_refused_even_when_it_arrives_whole(
    short_dir: Path, client: Callable[[Path], bytes]
) -> None:
    with _peer(short_dir / "p.sock", [_reply_of(LIMIT + 1) + b"\n"]) as closed:
        with pytest.raises(ProtocolError, match=f"more than {LIMIT} bytes"):
            client(short_dir / "p.sock")
        assert closed.wait(DEADLINE_S)


@pytest.mark.parametrize("client", CLIENTS.values(), ids=CLIENTS.keys())
@pytest.mark.parametrize("line_end", [b"\n", b""], ids=["line-end", "no-line-end"])
def test_a_reply_far_past_the_limit_is_refused_even_when_it_arrives_whole(
    short_dir: Path, client: Callable[[Path], bytes], line_end: bytes
) -> None:
    """Without a line end too: a protocol error at once, not a timeout."""
    with _peer(short_dir / "p.sock", [_reply_of(LIMIT * 10) + line_end]) as closed:
        with pytest.raises(ProtocolError, match=f"more than {LIMIT} bytes"):
            client(short_dir / "p.sock")
        assert closed.wait(DEADLINE_S)


def test_a_reply_of_megabytes_and_the_one_behind_it_arrive_whole(short_dir: Path) -> None:
    """A reply spread over many receives is read whole (each byte searched once for the
    line end); what came behind it answers the next call."""
    big = "é" * 1_000_000  # 2 MB of UTF-8, 32 receives of 64 KiB
    first = msgspec.json.encode({"jsonrpc": "2.0", "id": 1, "result": big}) + b"\n"
    second = msgspec.json.encode(
        {"jsonrpc": "2.0", "id": 2, "result": {"pong": True, "version": "x"}}
    )
    with (
        _peer(short_dir / "m.sock", [first + second + b"\n"]),
        Client(short_dir / "m.sock", timeout_s=DEADLINE_S) as client,
    ):
        assert msgspec.json.decode(client.call_raw("ping")) == big
        assert client.ping().pong is True  # already received, answered from the buffer
