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
