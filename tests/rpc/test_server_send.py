"""How the server writes lines: gathered parts, partial sends, one line at a time."""

from __future__ import annotations

import socket

import anyio
import pytest
from anyio.abc import UNIXSocketStream

from capsuled.rpc.server import Connection

pytestmark = pytest.mark.anyio

#: Much larger than a socket buffer, so the first send is partial.
BIG = b"[" + b"1," * 2_000_000 + b"1]"


def _read_lines(sock: socket.socket, count: int) -> list[bytes]:
    sock.settimeout(10)
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n")[:count]


async def test_a_line_larger_than_the_socket_buffer_arrives_whole_before_the_next() -> None:
    """The second line waits for the first, which the peer drains slowly."""
    ours, theirs = socket.socketpair()
    with theirs:
        stream = await UNIXSocketStream.from_socket(ours)
        async with stream:
            connection = Connection(stream, 1, write_timeout_s=10)
            head, body, tail = b'{"result":', memoryview(BIG), b"}"
            async with anyio.create_task_group() as tg:
                tg.start_soon(connection.send_line, head, body, tail)
                tg.start_soon(connection.send_line, b'{"note":true}')
                lines = await anyio.to_thread.run_sync(_read_lines, theirs, 2)
    assert lines == [b'{"result":' + BIG + b"}", b'{"note":true}']


async def test_a_sender_waiting_to_drain_is_woken_when_the_connection_closes() -> None:
    ours, theirs = socket.socketpair()
    outcome: list[bool] = []
    with theirs:
        stream = await UNIXSocketStream.from_socket(ours)
        connection = Connection(stream, 1, write_timeout_s=30)

        async def send() -> None:
            outcome.append(await connection.send_line(BIG))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                # Every other task blocked: the send is parked on the full socket buffer.
                await anyio.wait_all_tasks_blocked()
                assert connection.writing
                connection.notify_closing()
                await stream.aclose()
    assert outcome == [False]


async def test_a_peer_that_never_reads_is_dropped_after_the_write_timeout() -> None:
    """The write timeout leaves the peer part of a line: another line would read as
    its end, so the connection refuses every later line."""
    ours, theirs = socket.socketpair()
    with theirs:
        stream = await UNIXSocketStream.from_socket(ours)
        async with stream:
            connection = Connection(stream, 1, write_timeout_s=0.2)
            with anyio.fail_after(5):
                assert await connection.send_line(BIG) is False
            theirs.setblocking(False)
            received = 0
            while True:  # what the socket took of the line cut short
                try:
                    received += len(theirs.recv(1 << 20))
                except BlockingIOError:
                    break
            assert 0 < received < len(BIG) + 1
            assert await connection.send_line(b'{"note":true}') is False
            with pytest.raises(BlockingIOError):  # nothing was written after it
                theirs.recv(65536)
