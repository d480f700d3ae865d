"""The store's versions: v2 rows carry the exact identity, v1 stores are migrated in one
transaction, the daemon reads both and refuses what it does not know (docs/design.md §4, §14).

A version 1 store is made here by the SQL of version 1, written out in this
file (not taken from the kit), with rows in it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import Sleepers

from capsule_client.kit.proc import ProcessStart, process_start
from capsule_client.kit.store import OwnershipStore, StoreVersionError
from capsuled.reader.store import OwnershipReader, ProcessRow, StoreUnavailable

#: The schema of user_version 1, as its writers made it.
SCHEMA_V1 = """
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, context_id TEXT, title TEXT,
                       created_at INTEGER NOT NULL);
CREATE TABLE session_inputs (input_id TEXT PRIMARY KEY,
                             session_id TEXT NOT NULL REFERENCES sessions);
CREATE TABLE session_execs (exec_id TEXT PRIMARY KEY,
                            session_id TEXT NOT NULL REFERENCES sessions);
CREATE TABLE session_processes (pid INTEGER NOT NULL, started_at INTEGER NOT NULL,
                                session_id TEXT NOT NULL REFERENCES sessions,
                                PRIMARY KEY (pid, started_at));
INSERT INTO sessions VALUES ('ses_a', 'ctx', 'A', 1700000000);
INSERT INTO session_inputs VALUES ('inp_a', 'ses_a');
INSERT INTO session_execs VALUES ('exe_a', 'ses_a');
INSERT INTO session_processes VALUES (4242, 1700000001, 'ses_a');
INSERT INTO session_processes VALUES (4343, 1700000002, 'ses_a');
PRAGMA user_version = 1;
COMMIT;
"""

V1_ROWS = {4242: [ProcessRow(1700000001, "ses_a")], 4343: [ProcessRow(1700000002, "ses_a")]}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "capsule.db"
    path.parent.mkdir(mode=0o700)
    return path


def make_v1(db: Path, extra_sql: str = "") -> None:
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        raw.executescript(SCHEMA_V1.replace("COMMIT;", f"{extra_sql}\nCOMMIT;"))
    finally:
        raw.close()


def shape(db: Path) -> tuple[int, list[str], int]:
    """(user_version, session_processes' columns, rows), read in one read transaction."""
    raw = sqlite3.connect(db, isolation_level=None)
    try:
        raw.execute("BEGIN")
        (version,) = raw.execute("PRAGMA user_version").fetchone()
        cursor = raw.execute("SELECT * FROM session_processes")
        rows = cursor.fetchall()
        columns = [column[0] for column in cursor.description]
        raw.execute("COMMIT")
    finally:
        raw.close()
    return version, columns, len(rows)


V1_COLUMNS = ["pid", "started_at", "session_id"]
V2_COLUMNS = [*V1_COLUMNS, "boot_id", "start_ticks"]


def test_the_daemon_reads_a_version_1_store_its_rows_without_identity(db: Path) -> None:
    make_v1(db)
    ownership = OwnershipReader(db).session_process_ownership(["inp_a"], ["exe_a"], None)
    assert ownership.processes == V1_ROWS
    assert (ownership.inputs, ownership.execs) == ({"inp_a": "ses_a"}, {"exe_a": "ses_a"})


def test_the_kit_migrates_a_version_1_store_keeping_every_row(db: Path, pool: Sleepers) -> None:
    make_v1(db)
    assert shape(db) == (1, V1_COLUMNS, 2)
    process = pool.start()
    with OwnershipStore(db) as store:
        started = store.register_process(process.pid, "ses_a")
    assert shape(db) == (2, V2_COLUMNS, 3)
    start = process_start(process.pid)
    ownership = OwnershipReader(db).session_process_ownership(["inp_a"], ["exe_a"], None)
    assert ownership.processes == {
        **V1_ROWS,
        process.pid: [ProcessRow(started, "ses_a", start.boot_id, start.start_ticks)],
    }
    assert (ownership.inputs, ownership.execs) == ({"inp_a": "ses_a"}, {"exe_a": "ses_a"})
    assert ownership.contexts == {"ses_a": "ctx"}
    with OwnershipStore(db):  # opening a version 2 store changes nothing
        pass
    assert shape(db) == (2, V2_COLUMNS, 3)


def test_a_migration_that_fails_half_way_leaves_the_store_as_it_was(db: Path) -> None:
    """The second step of the migration fails (the column is there already): the first
    one is undone with it, and the store is the version 1 store it was, rows and all."""
    make_v1(db, "ALTER TABLE session_processes ADD COLUMN start_ticks INTEGER;")
    before = shape(db)
    with pytest.raises(sqlite3.OperationalError, match="duplicate column"):
        OwnershipStore(db)
    assert shape(db) == before == (1, [*V1_COLUMNS, "start_ticks"], 2)


def test_a_concurrent_reader_sees_version_1_or_version_2_never_a_half(tmp_path: Path) -> None:
    """A reader loops over read transactions while stores are migrated under it."""
    seen: set[tuple[int, tuple[str, ...], int]] = set()
    for n in range(10):
        db = tmp_path / f"h{n}" / "capsule.db"
        db.parent.mkdir()
        make_v1(db)
        done = threading.Event()

        def read(db: Path = db, done: threading.Event = done) -> None:
            while not done.is_set():
                version, columns, rows = shape(db)
                seen.add((version, tuple(columns), rows))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            OwnershipStore(db).close()
        finally:
            done.set()
            reader.join()
        version, columns, rows = shape(db)
        seen.add((version, tuple(columns), rows))
    assert seen <= {(1, tuple(V1_COLUMNS), 2), (2, tuple(V2_COLUMNS), 2)}
    assert (2, tuple(V2_COLUMNS), 2) in seen


@pytest.fixture
def newer(db: Path) -> Iterator[Path]:
    """A store a newer kit wrote: version 3."""
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
    raw = sqlite3.connect(db)
    try:
        raw.execute("PRAGMA user_version = 3")
    finally:
        raw.close()
    yield db


def test_the_kit_refuses_a_store_a_newer_kit_wrote(newer: Path) -> None:
    with pytest.raises(StoreVersionError, match="user_version 3, newer than this kit writes"):
        OwnershipStore(newer)
    assert shape(newer)[0] == 3  # left as it is


def test_the_daemon_says_what_to_do_with_a_store_a_newer_kit_wrote(newer: Path) -> None:
    with pytest.raises(StoreUnavailable) as refused:
        OwnershipReader(newer).session_process_ownership(["inp_a"], [], None)
    message = str(refused.value)
    assert "user_version 3, newer than this capsuled reads user_version 1 to 2" in message
    assert "upgrade capsuled" in message


def test_a_row_of_the_same_exact_process_is_replaced_not_doubled(db: Path, pool: Sleepers) -> None:
    """A process registered again after a clock step (its start time read 90 s later)
    keeps one row: the one written last."""
    process = pool.start()
    start = process_start(process.pid)
    stepped = ProcessStart(start.started_at_s + 90, start.boot_id, start.start_ticks)
    with OwnershipStore(db) as store:
        store.register_process(process.pid, "ses_a")
        store.register_process(process.pid, "ses_b", start=stepped)
        store.register_process(process.pid, "ses_c", started_at_s=start.started_at_s - 1000)
    rows = OwnershipReader(db).session_process_ownership([], [], None).processes[process.pid]
    assert rows == [
        ProcessRow(round(start.started_at_s - 1000), "ses_c"),
        ProcessRow(round(stepped.started_at_s), "ses_b", start.boot_id, start.start_ticks),
    ]


@pytest.mark.parametrize(
    ("boot_id", "start_ticks"),
    [("c36008ef-7ab3-459a-8839-c4c3d6179420", None), (None, 5), ("NOT-A-BOOT-ID", 5)],
)
def test_a_row_with_half_an_identity_is_read_as_one_without(
    db: Path, boot_id: str | None, start_ticks: int | None
) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
    raw = sqlite3.connect(db)
    try:
        with raw:
            raw.execute(
                "INSERT INTO session_processes VALUES (77, 1700000000, 'ses_a', ?, ?)",
                (boot_id, start_ticks),
            )
    finally:
        raw.close()
    ownership = OwnershipReader(db).session_process_ownership([], [], None)
    assert ownership.processes == {77: [ProcessRow(1700000000, "ses_a")]}
