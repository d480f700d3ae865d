"""The server and dispatcher in-process, with methods made for the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
from helpers.daemon import listen_unix

from capsule_client.wire import NoParams
from capsuled.rpc.jsonrpc import SPLICE_MIN_BYTES, Dispatcher, Encoded, Method
from capsuled.rpc.server import Server
from capsuled.service.lifecycle import Lifecycle

pytestmark = pytest.mark.anyio


async def _ping(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


async def _boom(params: NoParams) -> None:
    raise ZeroDivisionError("a bug in a method")


async def _unencodable(params: NoParams) -> object:
    return object()


METHODS = {
    "ping": Method(NoParams, _ping),
    "boom": Method(NoParams, _boom),
    "unencodable": Method(NoParams, _unencodable),
}


async def _joined(dispatcher: Dispatcher, line: bytes) -> bytes | None:
    """The dispatcher's reply to ``line`` as one text."""
    parts = await dispatcher.answer(line)
    return None if parts is None else b"".join(parts)


async def _exchange(sock: Path, lines: list[bytes]) -> list[Any]:
    async with await anyio.connect_unix(sock) as stream:
        replies = []
        buffer = b""
        for line in lines:
            await stream.send(line + b"\n")
            while b"\n" not in buffer:
                buffer += await stream.receive()
            reply, _, buffer = buffer.partition(b"\n")
            replies.append(json.loads(reply))
        return replies


async def test_an_exception_in_a_method_is_an_internal_error_and_the_connection_lives(
    short_dir: Path,
) -> None:
    dispatcher = Dispatcher(METHODS)
    server = Server(dispatcher)
    listener = listen_unix(short_dir / "t.sock")
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, listener)
            got = await _exchange(
                short_dir / "t.sock",
                [
                    b'{"jsonrpc":"2.0","id":1,"method":"boom"}',
                    b'{"jsonrpc":"2.0","id":2,"method":"unencodable"}',
                    b'{"jsonrpc":"2.0","id":3,"method":"ping"}',
                ],
            )
            server.stop_accepting()
            server.close_idle()
    assert got[0]["id"] == 1 and got[0]["error"]["code"] == -32603
    assert "ZeroDivisionError" in got[0]["error"]["message"]
    assert got[1]["id"] == 2 and got[1]["error"]["code"] == -32603
    assert got[2] == {"jsonrpc": "2.0", "id": 3, "result": {"pong": True}}
    failures = [e for e in logs if e["event"] == "method raised"]
    assert [e["method"] for e in failures] == ["boom", "unencodable"]
    assert all(e["exc_info"] is True and e["log_level"] == "error" for e in failures)


async def test_counts_each_request_and_its_outcome() -> None:
    seen: list[tuple[str, int | None]] = []
    dispatcher = Dispatcher(METHODS, on_request=lambda m, o, _s: seen.append((m, o)))
    await _joined(dispatcher, b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    await _joined(dispatcher, b'{"jsonrpc":"2.0","method":"boom"}')
    await _joined(dispatcher, b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":1}}')
    assert seen == [("ping", None), ("boom", -32603), ("ping", -32602)]


async def test_requests_while_shutting_down_are_refused() -> None:
    lifecycle = Lifecycle()
    dispatcher = Dispatcher(METHODS, stopping=lifecycle.is_stopping)
    lifecycle.request_shutdown()
    reply = await _joined(dispatcher, b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert reply is not None
    assert json.loads(reply)["error"]["code"] == -32005


async def test_a_connection_over_the_cap_is_told_overloaded(short_dir: Path) -> None:
    server = Server(Dispatcher(METHODS), max_connections=1)
    listener = listen_unix(short_dir / "c.sock")
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve, listener)
        async with await anyio.connect_unix(short_dir / "c.sock") as first:
            await first.send(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
            assert b'"pong":true' in await first.receive()
            async with await anyio.connect_unix(short_dir / "c.sock") as second:
                line = await second.receive()
                assert json.loads(line)["error"]["code"] == -32002
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await second.receive()
        server.stop_accepting()
        server.close_idle()


async def test_a_large_encoded_result_is_sent_from_its_own_buffer() -> None:
    """A ``Raw`` result past SPLICE_MIN_BYTES is a part of the reply, not copied into it."""
    encoded = msgspec.Raw(msgspec.json.encode({"items": ["x" * 100] * 2000}))
    assert len(encoded) >= SPLICE_MIN_BYTES

    async def big(params: NoParams) -> msgspec.Raw:
        return encoded

    dispatcher = Dispatcher({"big": Method(NoParams, big)})
    parts = await dispatcher.answer(b'{"jsonrpc":"2.0","id":"a\\"b","method":"big"}')
    assert parts is not None and len(parts) == 3
    assert isinstance(parts[1], memoryview) and parts[1].obj is encoded
    reply = json.loads(b"".join(parts))
    assert reply == {"jsonrpc": "2.0", "id": 'a"b', "result": {"items": ["x" * 100] * 2000}}
    joined = await _joined(dispatcher, b'{"jsonrpc":"2.0","id":"a\\"b","method":"big"}')
    assert joined == b"".join(parts)


async def test_a_small_result_is_one_part() -> None:
    dispatcher = Dispatcher(METHODS)
    parts = await dispatcher.answer(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert parts == (b'{"jsonrpc":"2.0","id":1,"result":{"pong":true}}',)


async def test_a_batch_stops_running_requests_once_its_replies_pass_the_cap() -> None:
    """A 1 MiB batch of snapshot requests must not make the daemon build gigabytes."""
    from capsuled.rpc.jsonrpc import BATCH_REPLY_MAX_BYTES

    encoded = msgspec.Raw(b'"' + b"x" * (1 << 20) + b'"')
    ran: list[int] = []

    async def big(params: NoParams) -> msgspec.Raw:
        ran.append(1)
        return encoded

    async def note(params: NoParams) -> None:
        ran.append(0)

    dispatcher = Dispatcher({"big": Method(NoParams, big), "note": Method(NoParams, note)})
    count = 2 * BATCH_REPLY_MAX_BYTES // len(encoded)
    items = [{"jsonrpc": "2.0", "id": i, "method": "big"} for i in range(count)]
    items.append({"jsonrpc": "2.0", "method": "note"})
    reply = await _joined(dispatcher, json.dumps(items).encode())

    assert reply is not None
    assert len(reply) < BATCH_REPLY_MAX_BYTES + 2 * len(encoded)
    replies = json.loads(reply)
    assert [r["id"] for r in replies] == list(range(count)), "every request is answered, in order"
    answered = [r for r in replies if "result" in r]
    refused = [r for r in replies if "error" in r]
    assert answered and refused and replies == answered + refused
    assert {r["error"]["code"] for r in refused} == {-32002}
    assert "batch" in refused[0]["error"]["message"]
    assert ran.count(1) == len(answered), "a refused request is not run"
    assert ran[-1] == 0, "notifications still run: they add nothing to the reply"


@pytest.mark.parametrize("size", [10, 200_000])
async def test_a_result_encoded_in_parts_is_sent_as_one_json_text(size: int) -> None:
    """Large: the parts go out as they are; small: joined. A batch joins them too."""
    parts = (b'{"items":[', b'"' + b"x" * size + b'"', b',"y"', b"]}")

    async def parted(params: NoParams) -> Encoded:
        return Encoded(parts)

    dispatcher = Dispatcher({"parted": Method(NoParams, parted)})
    line = b'{"jsonrpc":"2.0","id":7,"method":"parted"}'
    expected = {"jsonrpc": "2.0", "id": 7, "result": {"items": ["x" * size, "y"]}}
    reply = await dispatcher.answer(line)
    assert reply is not None
    assert json.loads(b"".join(reply)) == expected
    if size >= SPLICE_MIN_BYTES:
        assert any(part is parts[1] for part in reply)  # sent from its own buffer
    else:
        assert len(reply) == 1
    batch = await _joined(dispatcher, b"[" + line + b"," + line + b"]")
    assert batch is not None and json.loads(batch) == [expected, expected]


# Handlers that are plain functions and coroutine functions


def _ping_sync(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _boom_sync(params: NoParams) -> None:
    raise ZeroDivisionError("a bug in a method")


SYNC = {"ping": Method(NoParams, _ping_sync), "boom": Method(NoParams, _boom_sync)}

LINES = [
    b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
    b' {"jsonrpc":"2.0","id":"a","method":"ping","params":{}}\r',
    b'{"jsonrpc":"2.0","id":null,"method":"ping","params":[]}',
    b'{"jsonrpc":"2.0","id":9,"method":"ping","params":null}',
    b'{"jsonrpc":"2.0","method":"ping"}',  # a notification: no reply
    b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"x":1}}',  # -32602
    b'{"jsonrpc":"2.0","id":3,"method":"ping","params":[1]}',  # -32602
    b'{"jsonrpc":"2.0","id":4,"method":"ping","params":1}',  # -32600
    b'{"jsonrpc":"1.0","id":5,"method":"ping"}',  # -32600
    b'{"jsonrpc":"2.0","id":{},"method":"ping"}',  # -32600
    b'{"jsonrpc":"2.0","id":6,"method":"boom"}',  # -32603
    b'{"jsonrpc":"2.0","id":7,"method":"ping"',  # -32700
    b'[{"jsonrpc":"2.0","id":8,"method":"ping"},{"jsonrpc":"2.0","id":9,"method":"boom"}]',
    b'"just a string"',  # -32600
    b"\xff",  # -32700
    b"   ",  # blank: no reply
]


@pytest.mark.parametrize("line", LINES)
async def test_a_plain_function_answers_as_a_coroutine_function_does(line: bytes) -> None:
    """Same reply, same statistics, same log, whichever kind the handler is."""
    seen_sync: list[tuple[str, int | None]] = []
    seen_async: list[tuple[str, int | None]] = []
    sync = Dispatcher(SYNC, on_request=lambda m, o, _s: seen_sync.append((m, o)))
    coroutines = Dispatcher(METHODS, on_request=lambda m, o, _s: seen_async.append((m, o)))
    with structlog.testing.capture_logs() as logs_sync:
        reply_sync = await sync.answer(line)
    with structlog.testing.capture_logs() as logs_async:
        reply_async = await coroutines.answer(line)
    assert reply_sync == reply_async
    assert seen_sync == seen_async
    assert [log["event"] for log in logs_sync] == [log["event"] for log in logs_async]
    if b'"id":1,' in line:
        assert reply_sync == (b'{"jsonrpc":"2.0","id":1,"result":{"pong":true}}',)
