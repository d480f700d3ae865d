"""Kinds of hostile input the protocol fuzzer found, one test per kind (docs/protocol.md).

Each test names the kind of failure and checks it for several members of
the kind, not only the case the fuzzer first produced.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec
import pytest
import structlog
from helpers.daemon import listen_unix
from msgspec import Meta, Struct

from capsule_client.wire import NoParams
from capsuled.rpc.jsonrpc import Dispatcher, Method, ReplyParts
from capsuled.rpc.server import Server

pytestmark = pytest.mark.anyio


class Named(Struct, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1)]
    limit_ms: int = 0


async def _ping(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


def _ping_now(params: NoParams) -> dict[str, bool]:
    return {"pong": True}


async def _named(params: Named) -> str:
    return params.name


async def _limits(params: Named) -> dict[str, int]:
    assert type(params) is Named
    return {"limit_ms": params.limit_ms}


DISPATCHER = Dispatcher(
    {
        "ping": Method(NoParams, _ping),
        "named": Method(Named, _named),
        "limits": Method(Named, _limits),
    }
)


async def answer(line: bytes) -> Any:
    reply = await DISPATCHER.answer(line)
    return None if reply is None else json.loads(b"".join(reply))


def nest(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "line",
    [
        nest(5000),
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":' + nest(5000) + b"}",
        b'{"jsonrpc":"2.0","id":1,"method":"ping","x":' + nest(5000) + b"}",
        b'{"jsonrpc":"2.0","id":' + nest(5000) + b',"method":"ping"}',
        b'[{"jsonrpc":"2.0","id":1,"method":"ping"},' + nest(5000) + b"]",
        b'{"jsonrpc":"2.0","id":1,"method":"named","params":{"zz":' + nest(5000) + b"}}",
    ],
    ids=["top", "params", "extra-member", "id", "batch-item", "unknown-param"],
)
async def test_nesting_past_the_decoder_limit_is_a_parse_error(line: bytes) -> None:
    """Kind: an exception from decoding hostile JSON escaped and closed the connection."""
    reply = await answer(line)
    assert reply["error"]["code"] == -32700 and reply["id"] is None
    assert "nested too deeply" in reply["error"]["message"]


async def test_nesting_within_the_limit_is_decoded() -> None:
    reply = await answer(b'{"jsonrpc":"2.0","id":1,"method":"ping","x":' + nest(500) + b"}")
    assert reply["result"] == {"pong": True}


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"named","params":{"name":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"named","params":{"name":"\\uDBFFx"}}',
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
        b'"\\\\\\ud800"',  # an escaped backslash, then the escape
        b'["\\ud800"]',
    ],
    ids=["params", "params-upper", "id", "after-backslash", "batch"],
)
async def test_an_unpaired_surrogate_escape_is_named_in_the_parse_error(line: bytes) -> None:
    """Kind: msgspec said "Input data was truncated" of a whole line with a lone ``\\ud800``."""
    reply = await answer(line)
    assert reply["error"]["code"] == -32700 and reply["id"] is None
    message = reply["error"]["message"]
    assert "unpaired UTF-16 surrogate escape \\u" in message, message
    assert "truncated" not in message


async def test_a_truncated_line_and_an_escaped_backslash_keep_their_own_errors() -> None:
    truncated = await answer(b'{"jsonrpc":"2.0","id":1,"method":"ping"')
    assert truncated["error"]["message"] == "parse error: Input data was truncated"
    # "\\ud800" is a backslash and the text ud800, not an escape: a valid name.
    reply = await answer(b'{"jsonrpc":"2.0","id":1,"method":"named","params":{"name":"\\\\ud800"}}')
    assert reply["result"] == "\\ud800"


@pytest.mark.parametrize(
    "id", [b"1e400", b"-1e400", b"123456789012345678901234567890123", b"-0.0e-999", b"1E+999999"]
)
async def test_any_json_number_is_an_id_and_is_echoed_exactly(id: bytes) -> None:
    """Kind: ids were judged by whether Python could hold them, not by their JSON type."""
    parts = await DISPATCHER.answer(b'{"jsonrpc":"2.0","id":' + id + b',"method":"ping"}')
    assert parts is not None
    reply = b"".join(parts)
    assert reply.startswith(b'{"jsonrpc":"2.0","id":' + id + b',"result"'), reply


@pytest.mark.parametrize("space", [b"\x0b", b"\x0c", b"\x1c", b"\xc2\xa0", b"\x00"])
async def test_only_json_whitespace_may_surround_a_message(space: bytes) -> None:
    """Kind: bytes.strip() accepted whitespace JSON does not allow (RFC 8259 §2)."""
    for line in (space + b'{"jsonrpc":"2.0","id":1,"method":"ping"}', b"[]" + space):
        reply = await answer(line)
        assert reply["error"]["code"] == -32700, (line, reply)
    assert await answer(b' \t\r{"jsonrpc":"2.0","id":1,"method":"ping"} \t\r') == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"pong": True},
    }
    assert await answer(space) is not None


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (b'{"`":1}', "`"),
        (b'{"a`b` - at `$.name":1}', "a`b` - at `$.name"),
        (b'{"name":"x","\\u0060":1}', "`"),
        (b'{"k":1,"k":2}', "k"),
        (b'{"' + b"k" * 200_000 + b'":1}', "k" * 100),
        (b'{"name":5}', "name"),
        (b'{"name":""}', "name"),
        (b'{"name":"x","limit_ms":1e400}', "limit_ms"),
        (b'{"name":"x","limit_ms":true}', "limit_ms"),
        (b"{}", "name"),
        (b'{"limit_ms":3}', "name"),
    ],
    ids=[
        "backtick",
        "fake-path",
        "escaped-backtick",
        "duplicate",
        "long",
        "wrong-type",
        "too-short",
        "huge",
        "bool",
        "missing",
        "missing-after-other",
    ],
)
async def test_invalid_params_name_the_param_from_the_params_not_the_message(
    params: bytes, param: str
) -> None:
    """Kind: the param was parsed back out of msgspec's message, which quotes client text."""
    reply = await answer(b'{"jsonrpc":"2.0","id":1,"method":"named","params":' + params + b"}")
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["param"] == param
    assert len(reply["error"]["message"]) < 400


async def test_a_dispatcher_failure_costs_one_reply_not_the_connection(short_dir: Path) -> None:
    """Kind: anything the dispatcher raises must not close the connection unanswered.

    The dispatcher here fails on one line, as a bug in decoding or logging would.
    """

    class Failing(Dispatcher):
        async def answer(self, line: bytes) -> ReplyParts | None:
            if b"fail" in line:
                raise ValueError("a bug in decoding")
            return await super().answer(line)

    server = Server(Failing({"ping": Method(NoParams, _ping_now)}))
    listener = listen_unix(short_dir / "f.sock")
    lines = [b'"fail"', b'{"jsonrpc":"2.0","id":2,"method":"ping"}']
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, listener)
            async with await anyio.connect_unix(short_dir / "f.sock") as stream:
                await stream.send(b"\n".join(lines) + b"\n")
                buffer = b""
                while buffer.count(b"\n") < 2:
                    buffer += await stream.receive()
            server.stop_accepting()
    first, second = (json.loads(x) for x in buffer.splitlines())
    assert first["error"]["code"] == -32603 and first["id"] is None
    assert second["result"] == {"pong": True}
    assert any(e["event"] == "request could not be answered" for e in logs)


@pytest.mark.parametrize(
    "params",
    [b"null", b'{"name":"x","limit_ms":null}', b' { "limit_ms" : null , "name" : "x" } '],
)
async def test_null_params_and_null_optional_members_are_left_out(params: bytes) -> None:
    """Kind: clients of several languages send ``null`` for "not given"; msgspec refuses
    it for a member typed ``int = 0``."""
    line = b'{"jsonrpc":"2.0","id":1,"method":"%s","params":%s}'
    method = b"ping" if params == b"null" else b"limits"
    reply = await answer(line % (method, params))
    assert reply["result"] == ({"pong": True} if method == b"ping" else {"limit_ms": 0})


@pytest.mark.parametrize(
    ("params", "param"),
    [(b'{"name":null}', "name"), (b'{"name":"x","limit_ms":"1"}', "limit_ms"), (b"null", "name")],
)
async def test_null_for_a_required_member_is_still_refused(params: bytes, param: str) -> None:
    reply = await answer(b'{"jsonrpc":"2.0","id":1,"method":"limits","params":%s}' % params)
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["param"] == param


def test_named_is_what_msgspec_would_refuse() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"name":""}', type=Named)


async def test_out_of_descriptors_the_waiting_client_is_answered_overloaded(
    short_dir: Path,
) -> None:
    """Kind: accept failing with EMFILE left clients in the backlog with no answer.

    The server and the client share this process, so the test can use up
    every descriptor itself and leave room for the client's socket only.
    """
    server = Server(Dispatcher({"ping": Method(NoParams, _ping)}))
    path = short_dir / "e.sock"
    listener = listen_unix(path)
    hogs: list[int] = []
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve, listener)
            try:
                while True:
                    hogs.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            try:
                os.close(hogs.pop())  # room for the client's own socket
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.setblocking(False)
                    client.connect(str(path))
                    with anyio.fail_after(5):
                        await anyio.wait_readable(client)
                    first = client.recv(65536)
                    await anyio.wait_readable(client)
                    rest = client.recv(65536)
            finally:
                for fd in hogs:
                    os.close(fd)
            # With descriptors back, connections are served again.
            async with await anyio.connect_unix(path) as stream:
                await stream.send(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
                pong = json.loads(await stream.receive())
            server.stop_accepting()
    reply = json.loads(first)
    assert reply["error"]["code"] == -32002 and reply["id"] is None
    assert "file descriptors" in reply["error"]["message"]
    assert rest == b""
    assert pong["result"] == {"pong": True}
    assert any(e["event"] == "connection refused: out of file descriptors" for e in logs)


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"0\x00", -32700),
        (b"0 {{{", -32700),
        (b'"ping" x', -32700),
        (b"null,", -32700),
        (b"true false", -32700),
        (b"1 " + nest(5000), -32700),
        (b"0", -32600),
        (b'"ping"', -32600),
        (b" null ", -32600),
    ],
)
async def test_a_scalar_is_invalid_only_if_the_whole_line_is_json(line: bytes, code: int) -> None:
    """Kind: msgspec reported the first token's type before checking the rest was JSON."""
    reply = await answer(line)
    assert reply["error"]["code"] == code and reply["id"] is None


def test_a_full_listen_backlog_is_waited_out_not_called_daemon_not_running(
    short_dir: Path,
) -> None:
    """Kind: EAGAIN at connect (a busy daemon's full backlog) was reported as not running.

    A listener that does not accept stands for a daemon too busy to: its backlog
    of one fills, the client waits for room until its timeout, and gets in once
    the listener accepts.
    """
    from capsule_client import Client, RequestTimeout

    path = short_dir / "b.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(0)
        fillers = []
        for _ in range(8):  # fill the backlog, whatever the kernel rounds it up to
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(str(path))
            except BlockingIOError:
                s.close()
                break
            fillers.append(s)
        else:
            pytest.skip("the kernel's backlog did not fill")
        began = time.monotonic()
        with pytest.raises(RequestTimeout, match="backlog"), Client(path, timeout_s=0.3) as c:
            c.ping()
        assert time.monotonic() - began >= 0.25
        for s in fillers:
            s.close()
