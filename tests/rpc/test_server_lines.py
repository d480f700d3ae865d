"""How the server reads requests: lines as they arrive, paused when too many wait."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from helpers.daemon import listen_unix

from capsule_client.wire import NoParams
from capsuled.rpc.jsonrpc import Dispatcher, Method, ReplyParts
from capsuled.rpc.server import Server, current_connection

pytestmark = pytest.mark.anyio


@pytest.fixture
def unrendered_logs() -> Iterator[None]:
    """The log entries kept as they are instead of rendered as text.

    The server logs each request at debug; a burst of tens of thousands would
    spend most of its time rendering them, and make its deadline measure the
    machine's load instead of the reading.
    """
    with structlog.testing.capture_logs():
        yield


async def _ping(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _flood(path: Path, count: int) -> list[bytes]:
    """Send ``count`` pings in one go (ids 0..count-1) while reading the replies."""
    replies: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(path))

        def read() -> None:
            chunks: list[bytes] = []
            lines = 0
            while lines < count:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                lines += chunk.count(b"\n")
            replies.extend(b"".join(chunks).splitlines())

        reader = threading.Thread(target=read)
        reader.start()
        sock.sendall(
            b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n for n in range(count))
        )
        reader.join(20)
    return replies


async def test_a_peer_pipelining_megabytes_of_requests_gets_every_reply_in_order(
    short_dir: Path, unrendered_logs: None
) -> None:
    """More than the reader buffers before pausing (about 1 MiB): it pauses and resumes."""
    count = 32_000  # about 1.3 MB of requests
    server = Server(Dispatcher({"ping": Method(NoParams, _ping)}))
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(short_dir / "p.sock"))
        replies = await anyio.to_thread.run_sync(_flood, short_dir / "p.sock", count)
        server.stop_accepting()
        server.close_idle()
    assert len(replies) == count
    assert [json.loads(r)["id"] for r in replies] == list(range(count))


async def test_a_long_line_after_a_paused_burst_is_still_read_whole(
    short_dir: Path, unrendered_logs: None
) -> None:
    """Reading paused by a burst resumes for a line longer than the resume mark.

    The burst fills the reader past its pause mark; once the short lines are
    taken, what is left is the start of a long line, longer than the resume
    mark: reading must resume to receive the rest of it.
    """
    server = Server(Dispatcher({"ping": Method(NoParams, _ping)}))
    burst = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n for n in range(20_000))
    # About 800 kB of burst, then a 600 kB line: the pause comes with the
    # start of the long line buffered. JSON whitespace keeps it one request.
    padding = " " * 600_000
    long_line = b'{"jsonrpc":"2.0","id":"long",%s"method":"ping"}\n' % padding.encode()
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(short_dir / "l.sock"))
        with anyio.fail_after(20):
            async with (
                await anyio.connect_unix(short_dir / "l.sock") as stream,
                anyio.create_task_group() as sending,
            ):
                sending.start_soon(stream.send, burst + long_line)
                chunks: list[bytes] = []
                while b'"id":"long"' not in b"".join(chunks[-2:]):
                    chunks.append(await stream.receive())
                received = b"".join(chunks)
        server.stop_accepting()
        server.close_idle()
    assert received.count(b"\n") == 20_001


# Replies larger than the socket buffer, sync and async handlers


#: Larger than any Unix socket's send buffer here (about 208 KiB): its first
#: send is always partial.
BIG_BYTES = 2 * 1024 * 1024


def _ping_sync(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _big_sync(params: NoParams) -> dict[str, str]:
    return {"blob": "x" * BIG_BYTES}


def _request(id: int, method: str) -> bytes:
    return b'{"jsonrpc":"2.0","id":%d,"method":"%s"}\n' % (id, method.encode())


async def _read_lines(stream: anyio.abc.ByteStream, count: int) -> list[Any]:
    received = b""
    while received.count(b"\n") < count:
        received += await stream.receive()
    return [json.loads(line) for line in received.splitlines()]


async def test_a_reply_the_socket_does_not_take_whole_goes_out_before_the_next(
    short_dir: Path,
) -> None:
    server = Server(
        Dispatcher(
            {
                "big": Method(NoParams, _big_sync),
                "ping": Method(NoParams, _ping_sync),
                "slow": Method(NoParams, _ping),
            }
        )
    )
    requests = [(1, "big"), (2, "ping"), (3, "slow"), (4, "big"), (5, "ping")]
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(short_dir / "b.sock"))
        with anyio.fail_after(20):
            async with await anyio.connect_unix(short_dir / "b.sock") as stream:
                await stream.send(b"".join(_request(id, method) for id, method in requests))
                replies = await _read_lines(stream, len(requests))
        server.stop_accepting()
        server.close_idle()
    assert [reply["id"] for reply in replies] == [1, 2, 3, 4, 5]
    assert [len(reply["result"]["blob"]) for reply in (replies[0], replies[3])] == [BIG_BYTES] * 2


async def test_a_line_sent_while_a_large_reply_waits_to_be_sent_follows_it(
    short_dir: Path,
) -> None:
    """A notification scheduled by the handler, before its reply is sent, goes after it."""
    note = b'{"jsonrpc":"2.0","method":"note"}'
    sending = anyio.create_task_group()

    def big_then_note(params: NoParams) -> dict[str, str]:
        sending.start_soon(current_connection.get().send_line, note)
        return _big_sync(params)

    server = Server(Dispatcher({"big": Method(NoParams, big_then_note)}))
    async with sending, anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(short_dir / "n.sock"))
        with anyio.fail_after(20):
            async with await anyio.connect_unix(short_dir / "n.sock") as stream:
                await stream.send(_request(1, "big"))
                replies = await _read_lines(stream, 2)
        server.stop_accepting()
        server.close_idle()
    assert replies[0]["id"] == 1 and len(replies[0]["result"]["blob"]) == BIG_BYTES
    assert replies[1] == json.loads(note)


async def test_a_request_arriving_while_another_is_handled_is_not_answered_first(
    short_dir: Path,
) -> None:
    """While one request waits, a ping received behind it waits its turn."""
    release = anyio.Event()
    started = anyio.Event()
    answered: list[int] = []

    async def waits(params: NoParams) -> dict[str, bool]:
        started.set()
        await release.wait()
        answered.append(1)
        return {"waited": True}

    def ping(params: NoParams) -> dict[str, bool]:
        answered.append(2)
        return {"pong": True}

    server = Server(Dispatcher({"ping": Method(NoParams, ping), "waits": Method(NoParams, waits)}))
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listen_unix(short_dir / "w.sock"))
        with anyio.fail_after(20):
            async with await anyio.connect_unix(short_dir / "w.sock") as stream:
                await stream.send(_request(1, "waits"))
                await started.wait()
                await stream.send(_request(2, "ping"))
                await anyio.wait_all_tasks_blocked()  # the ping was received, and waits
                assert answered == []
                release.set()
                replies = await _read_lines(stream, 2)
        server.stop_accepting()
        server.close_idle()
    assert [reply["id"] for reply in replies] == [1, 2]
    assert answered == [1, 2]


async def test_a_failure_while_sending_a_reply_ends_only_that_connection(
    short_dir: Path,
) -> None:
    """Logged, the connection closed, the server serving on."""

    class Malformed(Dispatcher):
        async def answer(self, line: bytes) -> ReplyParts | None:
            if b"bad" in line:
                return (12345,)  # type: ignore[return-value]  # not bytes: sending it fails
            return await super().answer(line)

    server = Server(Malformed({"ping": Method(NoParams, _ping_sync)}))
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, listen_unix(short_dir / "f.sock"))
            with anyio.fail_after(20):
                async with await anyio.connect_unix(short_dir / "f.sock") as stream:
                    await stream.send(_request(1, "bad"))
                    with pytest.raises(anyio.EndOfStream):
                        await stream.receive()
                async with await anyio.connect_unix(short_dir / "f.sock") as stream:
                    await stream.send(_request(2, "ping"))
                    [reply] = await _read_lines(stream, 1)
            server.stop_accepting()
            server.close_idle()
    assert reply == {"jsonrpc": "2.0", "id": 2, "result": {"pong": True}}
    assert [log["event"] for log in logs if log["log_level"] == "warning"] == ["connection failed"]
