"""JSON-RPC 2.0 over the real socket, byte for byte (docs/design.md §7)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import raw_replies

MiB = 1024 * 1024
PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


def error(code: int, id: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code}}


def assert_error(reply: dict[str, Any], code: int, id: Any = None) -> None:
    assert reply["jsonrpc"] == "2.0"
    assert reply["id"] == id
    assert "result" not in reply
    assert reply["error"]["code"] == code, reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]


def test_ping_answers(sock: Path) -> None:
    [reply] = raw_replies(sock, PING + b"\n")
    assert reply["jsonrpc"] == "2.0" and reply["id"] == 1
    assert reply["result"]["pong"] is True
    assert isinstance(reply["result"]["version"], str)


@pytest.mark.parametrize(
    "line",
    [
        b"{bad",
        b'{"jsonrpc":"2.0",',
        b"\xff\xfe{}",
        b'{"jsonrpc":"2.0","method":"\xc3\x28"}',
        b"nul",
    ],
    ids=["malformed", "truncated", "binary", "invalid-utf8", "bare-word"],
)
def test_parse_error_has_null_id(sock: Path, line: bytes) -> None:
    [reply] = raw_replies(sock, line + b"\n")
    assert_error(reply, -32700)


@pytest.mark.parametrize(
    ("line", "id"),
    [
        (b"1", None),
        (b'"ping"', None),
        (b"null", None),
        (b'{"id":2,"method":"ping"}', 2),
        (b'{"jsonrpc":"1.0","id":3,"method":"ping"}', 3),
        (b'{"jsonrpc":2.0,"id":4,"method":"ping"}', 4),
        (b'{"jsonrpc":"2.0","id":5}', 5),
        (b'{"jsonrpc":"2.0","id":6,"method":42}', 6),
        (b'{"jsonrpc":"2.0","id":7,"method":"ping","params":"x"}', 7),
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":[1],"method":"ping"}', None),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', None),
    ],
    ids=[
        "number",
        "string",
        "null",
        "no-jsonrpc",
        "wrong-version",
        "version-not-string",
        "no-method",
        "method-not-string",
        "params-string",
        "id-object",
        "id-array",
        "id-bool",
    ],
)
def test_invalid_request(sock: Path, line: bytes, id: Any) -> None:
    [reply] = raw_replies(sock, line + b"\n")
    assert_error(reply, -32600, id)


def test_unknown_method_echoes_the_id(sock: Path) -> None:
    [reply] = raw_replies(sock, b'{"jsonrpc":"2.0","id":"abc","method":"no.such"}\n')
    assert_error(reply, -32601, "abc")
    assert "no.such" in reply["error"]["message"]


def test_invalid_params_name_the_parameter_and_the_reason(sock: Path) -> None:
    [unknown, positional] = raw_replies(
        sock,
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"colour":1}}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"ping","params":[1]}\n',
    )
    assert_error(unknown, -32602, 1)
    assert unknown["error"]["data"]["param"] == "colour"
    assert "unknown field" in unknown["error"]["data"]["reason"]
    assert "colour" in unknown["error"]["message"]
    assert_error(positional, -32602, 2)


def test_empty_params_are_no_params(sock: Path) -> None:
    got = raw_replies(
        sock,
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{}}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"ping","params":[]}\n'
        b'{"jsonrpc":"2.0","id":3,"method":"ping","params":null}\n',
    )
    assert [r["result"]["pong"] for r in got] == [True, True, True]


def test_null_for_an_optional_member_is_leaving_it_out(sock: Path) -> None:
    """``timeout_ms`` and ``usage`` are numbers and booleans with defaults: null is the default."""
    params = b'{"timeout_ms":null,"usage":null,"max_age_ms":null,"task":null,"since":null}'
    [reply] = raw_replies(
        sock, b'{"jsonrpc":"2.0","id":1,"method":"sessions.snapshot","params":%s}\n' % params
    )
    assert reply["id"] == 1 and reply["result"]["discovery"] in ("ready", "scanning"), reply
    [refused] = raw_replies(
        sock, b'{"jsonrpc":"2.0","id":2,"method":"sessions.unsubscribe","params":null}\n'
    )
    assert_error(refused, -32602, 2)
    assert refused["error"]["data"]["param"] == "subscription"


def test_a_notification_gets_no_reply_but_a_null_id_does(sock: Path) -> None:
    got = raw_replies(
        sock,
        b'{"jsonrpc":"2.0","method":"ping"}\n'
        b'{"jsonrpc":"2.0","method":"no.such"}\n'
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}\n',
    )
    assert len(got) == 1
    assert got[0]["id"] is None and got[0]["result"]["pong"] is True


def test_batches(sock: Path) -> None:
    [empty] = raw_replies(sock, b"[]\n")
    assert_error(empty, -32600)

    assert (
        raw_replies(sock, b'[{"jsonrpc":"2.0","method":"ping"},{"jsonrpc":"2.0","method":"x"}]\n')
        == []
    )

    [batch] = raw_replies(
        sock,
        b'[{"jsonrpc":"2.0","id":1,"method":"ping"},'
        b"1,"
        b'{"jsonrpc":"2.0","method":"ping"},'
        b'{"jsonrpc":"2.0","id":2,"method":"nope"},'
        b'{"foo":"bar"}]\n',
    )
    assert isinstance(batch, list) and len(batch) == 4
    assert batch[0]["id"] == 1 and batch[0]["result"]["pong"] is True
    assert_error(batch[1], -32600)
    assert_error(batch[2], -32601, 2)
    assert_error(batch[3], -32600)


def test_a_malformed_batch_is_a_parse_error(sock: Path) -> None:
    [reply] = raw_replies(sock, b'[{"jsonrpc":"2.0","id":1,"method":"ping"},\n')
    assert_error(reply, -32700)


def test_requests_on_one_connection_are_answered_in_order(sock: Path) -> None:
    lines = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"ping"}\n' % i for i in range(50))
    assert [r["id"] for r in raw_replies(sock, lines)] == list(range(50))


def test_blank_lines_are_ignored(sock: Path) -> None:
    assert [r["id"] for r in raw_replies(sock, b"\n  \n" + PING + b"\n\n")] == [1]


def test_a_final_line_without_newline_is_answered(sock: Path) -> None:
    [reply] = raw_replies(sock, PING)
    assert reply["result"]["pong"] is True


def test_a_message_of_exactly_the_limit_is_served(sock: Path) -> None:
    padding = b" " * (MiB - len(PING))
    line = PING[:-1] + padding + b"}"
    assert len(line) == MiB
    [reply] = raw_replies(sock, line + b"\n")
    assert reply["result"]["pong"] is True


@pytest.mark.parametrize("terminated", [True, False])
def test_a_message_over_the_limit_is_refused_and_the_connection_closed(
    sock: Path, terminated: bool
) -> None:
    line = PING[:-1] + b" " * (MiB - len(PING) + 1) + b"}"
    assert len(line) == MiB + 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(sock))
        s.sendall(line + (b"\n" + PING + b"\n" if terminated else b""))
        data = b""
        while chunk := s.recv(65536):  # ends when the daemon closes
            data += chunk
    [reply] = [json.loads(x) for x in data.splitlines()]
    assert_error(reply, -32600)
    assert "longer than" in reply["error"]["message"]


def test_the_daemon_lives_on_after_bad_input(sock: Path) -> None:
    raw_replies(sock, b"\x00" * 1000 + b"\n{{{{\n]]]\n")
    [reply] = raw_replies(sock, PING + b"\n")
    assert reply["result"]["pong"] is True
