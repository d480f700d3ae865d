"""What the clients make of what comes back: long replies, and lines too long to be one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec
import pytest

from capsule_client import AsyncClient, Client, ProtocolError

DEADLINE_S = 10.0


class ScriptedPeer:
    """A server of one connection on ``path``: after the first request line it
    sends ``reply`` as given, then reads until the client closes.

    ``closed_by_client`` is set when the client closed the connection.
    """

    def __init__(self, path: Path, reply: bytes) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._reply = reply
        self.closed_by_client = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        with connection:
            connection.settimeout(DEADLINE_S)
            received = b""
            while b"\n" not in received:
                received += connection.recv(65536)
            connection.sendall(self._reply)
            while connection.recv(65536):
                pass
            self.closed_by_client.set()

    @contextmanager
    def running(self) -> Iterator[ScriptedPeer]:
        self._thread.start()
        try:
            yield self
        finally:
            self._listener.close()
            self._thread.join(DEADLINE_S)


def _reply_line(request_id: int, result: object) -> bytes:
    return msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "result": result}) + b"\n"


@pytest.mark.parametrize("line_end", [b"", b"\n"], ids=["no-line-end", "line-end-past-the-limit"])
def test_a_line_longer_than_the_limit_is_a_protocol_error_not_a_timeout(
    short_dir: Path, line_end: bytes
) -> None:
    path = short_dir / "p.sock"
    with (
        ScriptedPeer(path, b"x" * 10_000 + line_end).running() as peer,
        Client(path, timeout_s=DEADLINE_S, max_reply_bytes=4096) as client,
    ):
        with pytest.raises(ProtocolError, match="more than 4096 bytes without a line end"):
            client.ping()
        assert peer.closed_by_client.wait(DEADLINE_S)


def test_the_async_client_also_refuses_a_line_longer_than_the_limit(short_dir: Path) -> None:
    path = short_dir / "a.sock"

    async def main() -> None:
        async with AsyncClient(path, timeout_s=DEADLINE_S, max_reply_bytes=4096) as client:
            with pytest.raises(ProtocolError, match="more than 4096 bytes without a line end"):
                await client.ping()

    with ScriptedPeer(path, b"x" * 10_000).running() as peer:
        anyio.run(main)
        assert peer.closed_by_client.wait(DEADLINE_S)


def test_a_reply_of_megabytes_and_the_one_behind_it_arrive_whole(short_dir: Path) -> None:
    """A reply spread over many receives is read whole; what follows it waits for the next call."""
    big = "é" * 1_000_000  # 2 MB of UTF-8, 32 receives of 64 KiB
    path = short_dir / "m.sock"
    replies = _reply_line(1, big) + _reply_line(2, {"pong": True, "version": "x"})
    with ScriptedPeer(path, replies).running(), Client(path, timeout_s=DEADLINE_S) as client:
        assert msgspec.json.decode(client.call_raw("ping")) == big
        assert client.ping().pong is True  # already received, answered from the buffer
