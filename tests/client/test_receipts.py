"""Receipt formats and their writer kit (docs/design.md §3, §9), on real processes and files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from helpers.processes import Sleepers
from helpers.world import make_home

from capsule_client.kit.receipts import (
    ExecReceipt,
    ProviderClientReceipt,
    ReceiptError,
    decode_exec_receipt,
    decode_provider_client_receipt,
    decode_servers_registry,
    is_valid_input_id,
    process_start_time,
    write_exec_receipt,
    write_provider_client_receipt,
)

NO_SUCH_PID = 2**31 - 1


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path / "home")


def test_process_start_time_matches_the_os(pool: Sleepers) -> None:
    process = pool.start()
    assert process_start_time(process.pid) == pytest.approx(
        psutil.Process(process.pid).create_time(), abs=0.01
    )
    assert process_start_time(os.getpid()) == pytest.approx(
        psutil.Process().create_time(), abs=0.01
    )


def test_process_start_time_of_a_missing_pid_raises() -> None:
    with pytest.raises(ProcessLookupError):
        process_start_time(NO_SUCH_PID)


def test_provider_client_receipt_is_written_atomically(home: Path, pool: Sleepers) -> None:
    process = pool.start()
    path = write_provider_client_receipt(
        home, "run1", "inp_abc", "client-1", process.pid, provider="opencode"
    )
    assert path == home / "runs/run1/inp_abc/provider-clients/client-1.json"
    receipt = decode_provider_client_receipt(path.read_bytes())
    assert receipt.pid == process.pid
    assert receipt.provider == "opencode"
    assert receipt.started_at.tzinfo is not None
    assert receipt.started_at_s == pytest.approx(
        psutil.Process(process.pid).create_time(), abs=0.01
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for directory in (home / "runs", home / "runs/run1", path.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["client-1.json"]


def test_rewriting_a_receipt_replaces_it_whole(home: Path, pool: Sleepers) -> None:
    first, second = pool.start(), pool.start()
    path = write_exec_receipt(home, "exe_1", first.pid, command="sleep 300")
    inode = path.stat().st_ino
    write_exec_receipt(home, "exe_1", second.pid)
    receipt = decode_exec_receipt(path.read_bytes())
    assert receipt.pid == second.pid
    assert receipt.command is None
    assert path.stat().st_ino != inode  # renamed over, never written in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["exe_1.json"]


def test_exec_receipt_has_whole_second_start(home: Path, pool: Sleepers) -> None:
    process = pool.start()
    path = write_exec_receipt(home, "exe_7", process.pid, command="sleep 300")
    assert path == home / "runtime/exec-processes/exe_7.json"
    raw = msgspec.json.decode(path.read_bytes())
    assert raw["schema_version"] == 1
    assert isinstance(raw["started_at"], int)
    assert abs(raw["started_at"] - psutil.Process(process.pid).create_time()) <= 0.5


def test_writer_refuses_bad_names_and_pids(home: Path) -> None:
    with pytest.raises(ReceiptError, match="input id"):
        write_provider_client_receipt(home, "run", "input_1", "c", 100, started_at_s=1.0)
    with pytest.raises(ReceiptError, match="exec id"):
        write_exec_receipt(home, "../escape", 100, started_at_s=1.0)
    with pytest.raises(ReceiptError, match="exec id"):
        write_exec_receipt(home, ".hidden", 100, started_at_s=1.0)
    with pytest.raises(ReceiptError, match="pid"):
        write_exec_receipt(home, "exe_1", 1, started_at_s=1.0)
    with pytest.raises(ProcessLookupError):
        write_exec_receipt(home, "exe_1", NO_SUCH_PID)
    assert not (home / "runtime/exec-processes/exe_1.json").exists()


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("inp_a", True),
        ("inp_" + "A-z_0" * 25 + "abc", True),
        ("inp_" + "a" * 129, False),
        ("inp_", False),
        ("inp_a.b", False),
        ("INP_a", False),
        ("xinp_a", False),
        ("inp_a\n", False),
    ],
)
def test_input_id_rule(name: str, valid: bool) -> None:
    assert is_valid_input_id(name) is valid


def test_decoders_ignore_unknown_fields() -> None:
    receipt = decode_provider_client_receipt(
        b'{"schema_version":1,"pid":42,"started_at":"2026-01-01T00:00:00+02:00","later":[1]}'
    )
    assert receipt == ProviderClientReceipt(
        1, 42, datetime(2025, 12, 31, 22, 0, tzinfo=UTC), provider=None
    )
    exec_receipt = decode_exec_receipt(
        b'{"schema_version":1,"exec_id":"e","pid":42,"started_at":7,"x":{}}'
    )
    assert exec_receipt == ExecReceipt(1, "e", 42, 7)
    servers = decode_servers_registry(b'[{"opencode_pid":42,"url":"http://x","y":1}]')
    assert [(s.opencode_pid, s.url, s.started_at) for s in servers] == [(42, "http://x", None)]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"{", "truncated"),
        (b"[]", "Expected `object`"),
        (b'{"schema_version":2,"pid":42,"started_at":"2026-01-01T00:00:00Z"}', "schema_version 2"),
        (b'{"schema_version":1,"pid":1,"started_at":"2026-01-01T00:00:00Z"}', "pid"),
        (b'{"schema_version":1,"pid":"42","started_at":"2026-01-01T00:00:00Z"}', "pid"),
        (b'{"schema_version":1,"pid":42,"started_at":"2026-01-01T00:00:00"}', "timezone"),
        (b'{"schema_version":1,"pid":42,"started_at":17}', "started_at"),
        (b'{"schema_version":1,"pid":42}', "started_at"),
    ],
)
def test_provider_client_decoder_rejects(data: bytes, reason: str) -> None:
    with pytest.raises(ReceiptError, match=reason):
        decode_provider_client_receipt(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"schema_version":1,"exec_id":"","pid":42,"started_at":1}', "exec_id"),
        (b'{"schema_version":1,"exec_id":"e","pid":0,"started_at":1}', "pid"),
        (b'{"schema_version":1,"exec_id":"e","pid":42,"started_at":"1"}', "started_at"),
        (b'{"schema_version":0,"exec_id":"e","pid":42,"started_at":1}', "schema_version 0"),
        (b"null", "Expected `object`"),
    ],
)
def test_exec_decoder_rejects(data: bytes, reason: str) -> None:
    with pytest.raises(ReceiptError, match=reason):
        decode_exec_receipt(data)


@pytest.mark.parametrize(
    "data", [b"{}", b'[{"opencode_pid":1}]', b'[{"url":"x"}]', b'[{"opencode_pid":5,"url":3}]']
)
def test_servers_decoder_rejects(data: bytes) -> None:
    with pytest.raises(ReceiptError, match="servers registry"):
        decode_servers_registry(data)


def test_client_side_needs_neither_psutil_nor_the_daemon() -> None:
    code = (
        "import sys, capsule_client.kit.receipts, capsule_client.kit.store;"
        "bad = {'psutil', 'capsuled', 'watchfiles', 'structlog'} & set(sys.modules);"
        "print(*sorted(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------
# Receipts the bad-input catalogue found escaping the decoders


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
