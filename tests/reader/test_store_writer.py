"""The WAL write-lock probe: a write transaction open or not (docs/design.md §4).

A real WAL store, real SQLite connections (in this process: ``F_OFD_GETLK``
sees the record locks of another open file of the same process too).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from capsule_client.kit.store import OwnershipStore
from capsuled.reader.store import OwnershipReader
from capsuled.reader.writer_probe import WriterProbe

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the probe tells only on Linux"
)


def test_a_write_transaction_is_seen_open_until_it_commits(tmp_path: Path) -> None:
    path = tmp_path / "capsule.db"
    with OwnershipStore(path) as store:
        store.register_session("ses_a")
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        probe = WriterProbe(str(path))
        assert probe.supported
        writer.execute("SELECT * FROM sessions").fetchall()  # the -shm file exists now
        assert not probe.writing()
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("INSERT INTO sessions VALUES ('ses_b', NULL, NULL, 0)")
        assert probe.writing()
        writer.execute("COMMIT")
        assert not probe.writing()
        writer.execute("BEGIN")
        writer.execute("SELECT * FROM sessions").fetchall()
        assert not probe.writing()  # a read transaction holds no write lock
        writer.execute("COMMIT")
        probe.close()
    finally:
        writer.close()


def test_no_store_and_no_shared_memory_file_mean_no_writer(tmp_path: Path) -> None:
    assert not WriterProbe(str(tmp_path / "capsule.db")).writing()
    (tmp_path / "capsule.db-shm").mkdir()  # not a regular file: never opened
    assert not WriterProbe(str(tmp_path / "capsule.db")).writing()


def test_the_store_reader_asks_and_closes_the_probe_with_its_connection(tmp_path: Path) -> None:
    path = tmp_path / "capsule.db"
    with OwnershipStore(path) as store:
        store.register_session("ses_a")
    reader = OwnershipReader(path)
    before = reader.version()
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("DELETE FROM sessions")
        assert reader.writing()
        assert reader.version() == before  # not committed: nothing to read yet
        writer.execute("COMMIT")
        assert not reader.writing()
        assert reader.version() != before
    finally:
        writer.close()
        reader.close()
    assert not reader.writing()  # asked again after close: opened afresh, free
    reader.close()
