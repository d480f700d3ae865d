"""Graceful shutdown of the real daemon on a real socket: drain, then clean up.

The rules are docs/design.md §8.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
from anyio.streams.buffered import BufferedByteReceiveStream

from capsule_client.kit.paths import lock_path_for
from capsule_client.wire import NoParams, PingResult
from capsuled.rpc.jsonrpc import Dispatcher, Method
from capsuled.service.config import Config
from capsuled.service.supervisor import Supervisor

SLOW = b'{"jsonrpc":"2.0","id":1,"method":"test.slow"}\n'


class SlowDaemon(Supervisor):
    """The daemon with one more method that takes ``delay_s`` to answer."""

    def __init__(self, config: Config, delay_s: float) -> None:
        super().__init__(config)
        self.slow_started = anyio.Event()

        async def slow(params: NoParams) -> PingResult:
            self.slow_started.set()
            await anyio.sleep(delay_s)
            return PingResult(pong=True, version="slow")

        self.methods["test.slow"] = Method(NoParams, slow)
        self.dispatcher = Dispatcher(self.methods)
        self.server.dispatcher = self.dispatcher


def config_in(short_dir: Path, drain_timeout_s: float) -> Config:
    home = short_dir / "home"
    return Config(home=home, socket=short_dir / "s.sock", drain_timeout_s=drain_timeout_s)


async def shut_down_during_a_slow_request(daemon: SlowDaemon) -> tuple[bytes, float]:
    """Start the daemon, send a slow request, shut down while it runs.

    Returns:
        Everything the client received, and how long ``run`` took after the
        shutdown was asked for.
    """
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run)
            stream = await anyio.connect_unix(daemon.config.socket)
            async with stream:
                await stream.send(SLOW)
                await daemon.slow_started.wait()
                asked_at = time.monotonic()
                daemon.request_shutdown()
                received = b""
                buffered = BufferedByteReceiveStream(stream)
                try:
                    received = await buffered.receive_until(b"\n", 1 << 20)
                except (anyio.IncompleteRead, anyio.EndOfStream):
                    received = bytes(buffered.buffer)
        return received, time.monotonic() - asked_at


def test_shutdown_lets_a_request_in_flight_finish(short_dir: Path) -> None:
    daemon_config = config_in(short_dir, drain_timeout_s=5.0)

    async def go() -> tuple[bytes, float]:
        return await shut_down_during_a_slow_request(SlowDaemon(daemon_config, delay_s=0.3))

    received, took_s = anyio.run(go)
    reply = json.loads(received)
    assert reply["id"] == 1 and reply["result"]["version"] == "slow"
    assert 0.2 < took_s < 5.0
    assert not daemon_config.socket.exists()  # the daemon made it, the daemon removed it
    assert lock_path_for(daemon_config.socket).read_text() == ""  # and let go of the lock


def test_shutdown_cancels_what_outlasts_the_drain_timeout(short_dir: Path) -> None:
    daemon_config = config_in(short_dir, drain_timeout_s=0.2)

    async def go() -> tuple[bytes, float]:
        return await shut_down_during_a_slow_request(SlowDaemon(daemon_config, delay_s=60))

    received, took_s = anyio.run(go)
    assert received == b""  # cancelled: no reply, the connection closed
    assert took_s < 3.0  # the 0.2 s drain timeout, not the 60 s request
    assert not daemon_config.socket.exists()
