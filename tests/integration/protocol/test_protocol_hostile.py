"""Hostile input over the real socket: every message gets its defined answer (docs/design.md §7).

The daemon must never die of its input, and a connection must not be dropped
without a reply for a message the specification gives an outcome to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.daemon import raw_replies

DEPTH = 100_000
DEEP = b"[" * DEPTH + b"]" * DEPTH
PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"[" * DEPTH, id="unclosed-array"),
        pytest.param(DEEP, id="nested-batch"),
        pytest.param(b'{"a":' * DEPTH + b"1" + b"}" * DEPTH, id="nested-object"),
        pytest.param(
            b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":' + DEEP + b"}}",
            id="nested-params",
        ),
        pytest.param(b'{"jsonrpc":"2.0","id":' + DEEP + b',"method":"ping"}', id="nested-id"),
        pytest.param(
            b'{"jsonrpc":"2.0","id":1,"method":"ping","extra":' + DEEP + b"}",
            id="nested-unknown-member",
        ),
        pytest.param(
            b'[{"jsonrpc":"2.0","id":1,"method":"ping","extra":' + DEEP + b"}]",
            id="nested-batch-element",
        ),
    ],
)
def test_json_nested_too_deeply_is_a_parse_error_and_the_connection_lives(
    sock: Path, line: bytes
) -> None:
    first, second = raw_replies(sock, line + b"\n" + PING + b"\n")
    assert first["id"] is None
    assert first["error"]["code"] == -32700, first
    assert "deep" in first["error"]["message"]
    assert second["id"] == 1 and second["result"]["pong"] is True


def test_a_missing_param_is_named_in_data(sock: Path) -> None:
    request = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "session.reconcile",
        "params": {"from_session": "ses_a", "context_id": "c"},
    }
    [reply] = raw_replies(sock, json.dumps(request).encode() + b"\n")
    assert reply["id"] == 7
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["param"] == "this_session"
    assert "missing" in reply["error"]["data"]["reason"]
    assert "this_session" in reply["error"]["message"]
