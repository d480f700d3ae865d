"""How the server writes lines: gathered parts, partial sends, one line at a time."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest
from anyio.abc import UNIXSocketStream

from capsuled.server import Connection, SendBudget

pytestmark = pytest.mark.anyio

#: Much larger than a socket buffer, so the first send is partial.
BIG = b"[" + b"1," * 2_000_000 + b"1]"


def _wmem_max() -> int:
    return int(Path("/proc/sys/net/core/wmem_max").read_text())


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


async def test_a_peer_that_never_reads_is_dropped_after_the_write_timeout() -> None:
    ours, theirs = socket.socketpair()
    with theirs:
        stream = await UNIXSocketStream.from_socket(ours)
        async with stream:
            connection = Connection(stream, 1, write_timeout_s=0.2)
            with anyio.fail_after(5):
                assert await connection.send_line(BIG) is False


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


async def test_a_large_reply_grows_the_send_buffer_within_the_servers_budget() -> None:
    """One connection's buffer grows (up to the kernel's cap); a second finds the budget spent."""
    budget = SendBudget(total=len(BIG) + 1)
    connections: list[Connection] = []
    growth: list[int] = []
    for ours, theirs in [socket.socketpair() for _ in range(2)]:
        with theirs:
            before = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            stream = await UNIXSocketStream.from_socket(ours)
            async with stream:
                connection = Connection(stream, 1, write_timeout_s=10, send_budget=budget)
                connections.append(connection)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(connection.send_line, BIG)
                    (line,) = await anyio.to_thread.run_sync(_read_lines, theirs, 1)
                    assert line == BIG
                growth.append(ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - before)
    # Linux reports twice what was set, capped at twice net.core.wmem_max: on a
    # kernel whose cap is the default buffer, nothing can grow.
    if 2 * _wmem_max() > before:
        assert growth[0] > 0
    else:
        assert growth[0] == 0
    assert growth[1] == 0  # the budget holds one grant at a time
    assert budget.left < len(BIG) + 1
    connections[0].release_send_buffer()
    connections[1].release_send_buffer()  # nothing was granted: nothing to give back
    assert budget.left == len(BIG) + 1


def test_the_send_budget_grants_whole_requests_and_takes_them_back() -> None:
    budget = SendBudget(total=10)
    assert budget.take(6) == 6
    assert budget.take(6) == 0  # no partial grant
    budget.give(6)
    assert budget.take(10) == 10
