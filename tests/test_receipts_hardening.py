"""Kinds of receipt the catalogue found escaping the decoders (SPEC §3)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from capsule_client.receipts import (
    ReceiptError,
    decode_exec_receipt,
    decode_provider_client_receipt,
    decode_servers_registry,
)

GOOD: dict[str, bytes] = {
    "provider": b'{"schema_version":1,"pid":42,"started_at":"2026-01-01T00:00:00+00:00"%s}',
    "exec": b'{"schema_version":1,"exec_id":"e","pid":42,"started_at":1%s}',
    "servers": b'[{"opencode_pid":42%s}]',
}
DECODERS: dict[str, Callable[[bytes], Any]] = {
    "provider": decode_provider_client_receipt,
    "exec": decode_exec_receipt,
    "servers": decode_servers_registry,
}


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_the_good_forms_decode(kind: str) -> None:
    decoded = DECODERS[kind](GOOD[kind] % b"")
    entry = decoded[0] if kind == "servers" else decoded
    pid = entry.opencode_pid if kind == "servers" else entry.pid
    assert pid == 42, decoded


@pytest.mark.parametrize("kind", sorted(GOOD))
@pytest.mark.parametrize(
    "extra",
    [
        b',"x":' + b"[" * 30_000 + b"]" * 30_000,
        b',"x":' + b'{"a":' * 30_000 + b"1" + b"}" * 30_000,
        b',"x":"\xff"',
        b',"x":"\xed\xa0\x80"',
        b',"\xc3\x28":1',
    ],
    ids=["deep-array", "deep-object", "invalid-utf8", "utf8-surrogate", "invalid-utf8-key"],
)
def test_every_malformed_receipt_is_a_receipt_error(kind: str, extra: bytes) -> None:
    """Kind: skipped members were neither UTF-8-checked nor bounded in depth.

    A ``RecursionError`` escaped the reader and failed every observation
    (-32603), so one hostile file denied service to every client.
    """
    with pytest.raises(ReceiptError):
        DECODERS[kind](GOOD[kind] % extra)


def test_a_deep_value_in_a_known_field_is_a_receipt_error_too() -> None:
    with pytest.raises(ReceiptError):
        decode_exec_receipt(json.dumps({"pid": [[[[1]]]]}).encode())
