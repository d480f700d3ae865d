"""The exact identity writers record: boot id and start ticks (docs/design.md §3, §14).

The reference values are read here from the files the kernel writes, by the
test's own parsing, not through the writer kit.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers.processes import Sleepers
from helpers.world import make_home

from capsule_client.kit.proc import ProcessStart, boot_id, is_boot_id, process_start
from capsule_client.kit.receipts import (
    ReceiptError,
    decode_exec_receipt,
    decode_provider_client_receipt,
    write_exec_receipt,
    write_provider_client_receipt,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the exact identity is Linux's"
)


def kernel_boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def kernel_start_ticks(pid: int) -> int:
    """Field 22 of ``/proc/<pid>/stat``, counted after the command name's last ``)``."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return int(data[data.rindex(b")") + 2 :].split()[19])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path / "home")


def test_the_kit_reads_the_kernels_boot_id_and_start_ticks(pool: Sleepers) -> None:
    process = pool.start()
    start = process_start(process.pid)
    assert start.boot_id == boot_id() == kernel_boot_id()
    assert start.start_ticks == kernel_start_ticks(process.pid)
    assert is_boot_id(kernel_boot_id())


@pytest.mark.parametrize(
    "text",
    [
        "",
        "C36008EF-7AB3-459A-8839-C4C3D6179420",
        "{c36008ef-7ab3-459a-8839-c4c3d6179420}",
        "x" * 36,
    ],
)
def test_a_boot_id_not_written_as_the_kernel_writes_one_is_none(text: str) -> None:
    assert not is_boot_id(text)


def test_both_writers_record_the_processs_exact_identity(home: Path, pool: Sleepers) -> None:
    process = pool.start()
    client = json.loads(
        write_provider_client_receipt(home, "r", "inp_a", "c", process.pid).read_bytes()
    )
    execution = json.loads(write_exec_receipt(home, "exe_a", process.pid).read_bytes())
    for written in (client, execution):
        assert written["boot_id"] == kernel_boot_id()
        assert written["start_ticks"] == kernel_start_ticks(process.pid)
    assert decode_exec_receipt(json.dumps(execution).encode()).start_ticks == kernel_start_ticks(
        process.pid
    )


def test_a_start_time_given_alone_records_no_identity(home: Path) -> None:
    path = write_exec_receipt(home, "exe_a", os.getpid(), started_at_s=1_700_000_000)
    written = json.loads(path.read_bytes())
    assert written["started_at"] == 1_700_000_000
    assert "boot_id" not in written and "start_ticks" not in written


def test_a_start_given_whole_is_recorded_as_given(home: Path) -> None:
    start = ProcessStart(1_700_000_000.4, str(uuid.uuid4()), 12345)
    path = write_provider_client_receipt(home, "r", "inp_a", "c", os.getpid(), start=start)
    receipt = decode_provider_client_receipt(path.read_bytes())
    assert (receipt.started_at_s, receipt.boot_id, receipt.start_ticks) == start


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"started_at_s": 1.0, "start": ProcessStart(1.0)}, "not both"),
        ({"start": ProcessStart(1.0, None, 5)}, "go together"),
        ({"start": ProcessStart(1.0, "c36008ef", 5)}, "as the kernel writes one"),
    ],
)
def test_a_writer_refuses_a_start_that_names_no_process(
    home: Path, given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ReceiptError, match=message):
        write_exec_receipt(home, "exe_a", os.getpid(), **given)
    assert not (home / "runtime").exists()  # nothing written


def exec_doc(**extra: object) -> bytes:
    doc = {"schema_version": 1, "exec_id": "e", "pid": 42, "started_at": 5, **extra}
    return json.dumps(doc).encode()


def client_doc(**extra: object) -> bytes:
    doc = {"schema_version": 1, "pid": 42, "started_at": "2026-01-01T00:00:00+00:00", **extra}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("doc", [exec_doc, client_doc])
def test_a_receipt_without_the_identity_decodes_as_before(doc: Any) -> None:
    decoded = (
        decode_exec_receipt(doc()) if doc is exec_doc else decode_provider_client_receipt(doc())
    )
    assert (decoded.boot_id, decoded.start_ticks) == (None, None)


@pytest.mark.parametrize("doc", [exec_doc, client_doc])
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"boot_id": "c36008ef-7ab3-459a-8839-c4c3d6179420"}, "go together"),
        ({"start_ticks": 7}, "go together"),
        ({"boot_id": "C36008EF-7AB3-459A-8839-C4C3D6179420", "start_ticks": 7}, "boot_id"),
        ({"boot_id": "c36008ef-7ab3-459a-8839-c4c3d6179420", "start_ticks": -1}, "start_ticks"),
        ({"boot_id": "c36008ef-7ab3-459a-8839-c4c3d6179420", "start_ticks": "7"}, "start_ticks"),
    ],
)
def test_a_receipt_with_half_or_a_malformed_identity_is_an_error(
    doc: Any, extra: dict[str, object], message: str
) -> None:
    decode = decode_exec_receipt if doc is exec_doc else decode_provider_client_receipt
    with pytest.raises(ReceiptError, match=message):
        decode(doc(**extra))
