"""Replies on one connection keep their order and stay whole, whatever their handler.

Handlers that are plain functions and coroutine functions, large and small
replies, batches and bad lines, while notifications are pushed by other
tasks; a client that reads slowly makes every kind of send partial.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers.daemon import listen_unix

from capsule_client.wire import NoParams
from capsuled.rpc.jsonrpc import Dispatcher, Method
from capsuled.rpc.server import Server, current_connection

pytestmark = pytest.mark.anyio

BIG = 300_000  # more than a Unix socket's send buffer: the first send is partial


async def _big(params: NoParams) -> dict[str, str]:
    return {"blob": "b" * BIG}


def _ping_sync(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _big_sync(params: NoParams) -> dict[str, str]:
    return {"blob": "b" * BIG}


async def _slow(params: NoParams) -> dict[str, bool]:
    await anyio.sleep(0.001)
    return {"slow": True}


def _script(rng: random.Random, count: int) -> tuple[bytes, list[Any]]:
    """``count`` lines of many kinds, and the ids of the replies owed, in order."""
    lines: list[bytes] = []
    owed: list[Any] = []
    kinds = ["ping", "ping", "ping", "big_sync", "big", "slow", "note", "blank", "bad", "batch"]
    for n in range(count):
        kind = rng.choice(kinds)
        if kind == "note":
            lines.append(b'{"jsonrpc":"2.0","method":"ping"}')
        elif kind == "blank":
            lines.append(b"  ")
        elif kind == "bad":
            lines.append(b'{"jsonrpc":"2.0","id":%d,"method":' % n)
            owed.append(None)  # a parse error has a null id
        elif kind == "batch":
            lines.append(
                b'[{"jsonrpc":"2.0","id":"%d-a","method":"ping"},'
                b'{"jsonrpc":"2.0","id":"%d-b","method":"slow"}]' % (n, n)
            )
            owed.append([f"{n}-a", f"{n}-b"])
        else:
            lines.append(b'{"jsonrpc":"2.0","id":%d,"method":"%s"}' % (n, kind.encode()))
            owed.append(n)
    return b"".join(line + b"\n" for line in lines), owed


def _converse(path: Path, data: bytes, rng: random.Random, replies_owed: int) -> list[Any]:
    """Send ``data`` in random chunks while reading slowly; every line received, decoded."""
    received = bytearray()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect(str(path))
        done = threading.Event()

        def read() -> None:
            replies = 0
            start = 0  # where the line being received starts
            while replies < replies_owed:
                chunk = sock.recv(rng.choice([7, 100, 4096, 65536]))
                if not chunk:
                    break
                received.extend(chunk)
                while (end := received.find(b"\n", start)) >= 0:
                    if not received.startswith(b'{"jsonrpc":"2.0","method"', start):
                        replies += 1
                    start = end + 1
            done.set()

        reader = threading.Thread(target=read)
        reader.start()
        at = 0
        while at < len(data):
            size = rng.choice([1, 3, 40, 41, 200, 5000])
            sock.sendall(data[at : at + size])
            at += size
        assert done.wait(30), "not every reply arrived"
        reader.join(5)
    return [json.loads(line) for line in bytes(received).split(b"\n")[:-1]]


@pytest.mark.parametrize("seed", range(4))
async def test_mixed_pipelined_requests_get_whole_replies_in_order(
    short_dir: Path, seed: int
) -> None:
    rng = random.Random(seed)
    notes = anyio.create_task_group()

    async def subscribe(params: NoParams) -> dict[str, bool]:
        connection = current_connection.get()

        async def push() -> None:
            for n in range(40):
                line = b'{"jsonrpc":"2.0","method":"changed","params":{"n":%d,"pad":"%s"}}' % (
                    n,
                    b"p" * (n * 997 % 50_000),
                )
                if not await connection.send_line(line):
                    return
                await anyio.sleep(0.0005)

        notes.start_soon(push)
        return {"subscribed": True}

    server = Server(
        Dispatcher(
            {
                "ping": Method(NoParams, _ping_sync),
                "big_sync": Method(NoParams, _big_sync),
                "big": Method(NoParams, _big),
                "slow": Method(NoParams, _slow),
                "subscribe": Method(NoParams, subscribe),
            }
        ),
        write_timeout_s=30,
    )
    data, owed = _script(rng, 300)
    data = b'{"jsonrpc":"2.0","id":"sub","method":"subscribe"}\n' + data
    owed.insert(0, "sub")
    path = short_dir / "m.sock"
    async with notes, anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(path))
        with anyio.fail_after(60):
            messages = await anyio.to_thread.run_sync(_converse, path, data, rng, len(owed))
        server.stop_accepting()
        server.close_idle()
    replies = [m for m in messages if not (isinstance(m, dict) and "method" in m)]
    got = [[r["id"] for r in m] if isinstance(m, list) else m["id"] for m in replies]
    assert got == owed
    for reply in replies:
        if isinstance(reply, dict) and "blob" in reply.get("result", {}):
            assert len(reply["result"]["blob"]) == BIG
    pushed = [m["params"]["n"] for m in messages if isinstance(m, dict) and "method" in m]
    assert pushed == sorted(pushed)


def _ping_line(id: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % id


async def test_a_peer_gone_before_its_reply_costs_only_its_connection(
    short_dir: Path,
) -> None:
    """A reply to a closed peer fails in its connection: nothing reaches the event
    loop's exception handler, and the next client is served."""
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
    server = Server(
        Dispatcher(
            {
                "ping": Method(NoParams, _ping_sync),
                "big_sync": Method(NoParams, _big_sync),
            }
        )
    )
    path = short_dir / "g.sock"
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(path))
        with anyio.fail_after(20):
            for n in range(50):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.connect(str(path))
                    method = b"big_sync" if n % 2 else b"ping"
                    sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"%s"}\n' % method * 3)
                    if n % 3 == 0:  # unread data at close: a reset
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            while server.clients:  # noqa: ASYNC110 (each connection ends by itself)
                await anyio.sleep(0.01)
            async with await anyio.connect_unix(path) as stream:
                await stream.send(_ping_line(7))
                reply = json.loads(await stream.receive())
        server.stop_accepting()
        server.close_idle()
    assert reply["id"] == 7 and reply["result"] == {"pong": True}
    assert loop_errors == []


async def test_a_last_line_without_newline_after_a_half_close_follows_a_partial_reply(
    short_dir: Path,
) -> None:
    """A peer that pipelines a big request, a ping without its newline and
    half-closes, before reading anything, gets both replies in order, then end-of-stream."""
    server = Server(
        Dispatcher(
            {
                "ping": Method(NoParams, _ping_sync),
                "big_sync": Method(NoParams, _big_sync),
            }
        )
    )
    path = short_dir / "h.sock"

    def exchange() -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(20)
            sock.connect(str(path))
            sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"big_sync"}\n')
            sock.sendall(b'{"jsonrpc":"2.0","id":2,"method":"ping"}')
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(path))
        with anyio.fail_after(20):
            received = await anyio.to_thread.run_sync(exchange)
        server.stop_accepting()
        server.close_idle()
    replies = [json.loads(line) for line in received.splitlines()]
    assert [r["id"] for r in replies] == [1, 2]
    assert len(replies[0]["result"]["blob"]) == BIG
