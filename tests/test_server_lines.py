"""How the server reads requests: lines as they arrive, paused when too many wait."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import anyio
import pytest
from support import listen_unix

from capsule_client.protocol import NoParams
from capsuled.jsonrpc import Dispatcher, Method
from capsuled.server import Server

pytestmark = pytest.mark.anyio


async def _ping(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _flood(path: Path, count: int) -> list[bytes]:
    """Send ``count`` pings in one go (ids 0..count-1) while reading the replies."""
    replies: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(str(path))

        def read() -> None:
            data = b""
            while data.count(b"\n") < count:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
            replies.extend(data.splitlines())

        reader = threading.Thread(target=read)
        reader.start()
        sock.sendall(
            b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % n for n in range(count))
        )
        reader.join(20)
    return replies


async def test_a_peer_pipelining_megabytes_of_requests_gets_every_reply_in_order(
    short_dir: Path,
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


async def test_a_long_line_after_a_paused_burst_is_still_read_whole(short_dir: Path) -> None:
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
                received = b""
                while b'"id":"long"' not in received:
                    received += await stream.receive()
        server.stop_accepting()
        server.close_idle()
    assert received.count(b"\n") == 20_001
