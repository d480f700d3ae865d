"""The ownership store: the writer kit and the daemon's read-only side, real SQLite.

The rules are docs/design.md §4.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from helpers.processes import Sleepers

from capsule_client.kit.proc import process_start
from capsule_client.kit.store import OwnershipStore, StoreVersionError
from capsuled.reader.store import (
    CHUNK_SIZE,
    Ownership,
    OwnershipReader,
    ProcessRow,
    StoreUnavailable,
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "home" / "capsule.db"


def test_writer_creates_the_schema_in_wal_with_user_version_2(db: Path) -> None:
    with OwnershipStore(db):
        pass
    with OwnershipStore(db):  # opening again keeps it
        pass
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert raw.execute("PRAGMA user_version").fetchone() == (2,)
        tables = {
            row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
    finally:
        raw.close()
    assert tables == {"sessions", "session_inputs", "session_execs", "session_processes"}
    assert db.parent.stat().st_mode & 0o777 == 0o700


def made_with(db: Path, sql: str) -> None:
    """A database at ``db`` made by a plain connection running ``sql``, not the writer kit."""
    raw = sqlite3.connect(db)
    try:
        raw.execute(sql)
    finally:
        raw.close()


def test_writer_refuses_another_user_version(db: Path) -> None:
    db.parent.mkdir()
    made_with(db, "PRAGMA user_version = 7")
    with pytest.raises(StoreVersionError, match="user_version 7"):
        OwnershipStore(db)


def test_ownership_answers_only_the_keys_asked(db: Path, pool: Sleepers) -> None:
    process = pool.start()
    with OwnershipStore(db) as store:
        store.register_session("ses_a", context_id="ctx_a", title="A")
        store.register_session("ses_b")
        store.register_input("inp_a", "ses_a")
        store.register_input("inp_other", "ses_b")
        store.register_exec("exe_b", "ses_b")
        started = store.register_process(process.pid, "ses_a")
        identity = process_start(process.pid)
        store.register_process(process.pid, "ses_b", started_at_s=started - 1000)
        store.register_process(424242, "ses_b", started_at_s=5)
    ownership = OwnershipReader(db).session_process_ownership(
        ["inp_a", "inp_unknown"], ["exe_b"], [process.pid, 99]
    )
    assert ownership == Ownership(
        inputs={"inp_a": "ses_a"},
        execs={"exe_b": "ses_b"},
        processes={
            process.pid: [
                ProcessRow(started - 1000, "ses_b"),
                ProcessRow(started, "ses_a", identity.boot_id, identity.start_ticks),
            ]
        },
        contexts={"ses_a": "ctx_a", "ses_b": None},
    )


def test_re_registering_moves_ownership(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_a", context_id="one")
        store.register_session("ses_b")
        store.register_input("inp_x", "ses_a")
        store.register_input("inp_x", "ses_b")
        store.register_session("ses_a", context_id="two")
        store.register_input("inp_y", "ses_a")
    ownership = OwnershipReader(db).session_process_ownership(["inp_x", "inp_y"], [], [])
    assert ownership.inputs == {"inp_x": "ses_b", "inp_y": "ses_a"}
    assert ownership.contexts == {"ses_a": "two", "ses_b": None}


def test_key_lists_longer_than_sqlites_variable_limit(db: Path) -> None:
    count = 40_000  # above SQLITE_MAX_VARIABLE_NUMBER (32766 since 3.32, 999 before)
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
        with store._db:  # one transaction for speed; the kit's calls are per row
            store._db.execute("BEGIN")
            store._db.executemany(
                "INSERT INTO session_execs VALUES (?, 'ses_a')",
                ((f"exe_{i}",) for i in range(count)),
            )
            store._db.executemany(
                "INSERT INTO session_processes (pid, started_at, session_id)"
                " VALUES (?, 1, 'ses_a')",
                ((i,) for i in range(count)),
            )
            store._db.execute("COMMIT")
    assert CHUNK_SIZE < 999
    ownership = OwnershipReader(db).session_process_ownership(
        [], (f"exe_{i}" for i in range(count + 10)), range(2, count + 10)
    )
    assert len(ownership.execs) == count
    assert len(ownership.processes) == count - 2


def test_missing_store_means_nobody_owns_anything(db: Path) -> None:
    ownership = OwnershipReader(db).session_process_ownership(["inp_a"], ["exe_a"], [1, 2])
    assert ownership.inputs == ownership.execs == ownership.processes == {}
    assert ownership.gaps == (f"ownership store {db} does not exist; nobody owns anything",)
    assert not db.exists()  # read-only: asking did not create it


@pytest.mark.parametrize("made", ["an empty file", "an empty WAL database"])
def test_a_store_whose_schema_is_not_committed_yet_means_nobody_owns_anything(
    db: Path, made: str
) -> None:
    db.parent.mkdir()
    db.write_bytes(b"")
    if made == "an empty WAL database":
        made_with(db, "PRAGMA journal_mode=WAL")
    ownership = OwnershipReader(db).session_process_ownership(["inp_a"], [], None)
    assert ownership.inputs == ownership.execs == ownership.processes == {}
    assert ownership.gaps == (f"ownership store {db} has no schema yet; nobody owns anything",)


def test_a_store_with_tables_but_no_user_version_is_unavailable(db: Path) -> None:
    db.parent.mkdir()
    made_with(db, "CREATE TABLE other (x)")
    with pytest.raises(StoreUnavailable, match="user_version 0, which no capsule writer kit"):
        OwnershipReader(db).session_process_ownership([], [], [])


def test_corrupt_store_is_unavailable(db: Path) -> None:
    db.parent.mkdir()
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailable, match=r"capsule\.db.*not a database"):
        OwnershipReader(db).session_process_ownership(["inp_a"], [], [])


def test_wrong_user_version_is_unavailable(db: Path) -> None:
    with OwnershipStore(db):
        pass
    made_with(db, "PRAGMA user_version = 3")
    with pytest.raises(StoreUnavailable, match="user_version 3, newer than"):
        OwnershipReader(db).session_process_ownership([], [], [])


def test_store_locked_past_the_timeout_is_unavailable(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
    locker = sqlite3.connect(db, isolation_level=None)
    try:
        locker.execute("PRAGMA locking_mode = EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        locker.execute("INSERT INTO sessions VALUES ('ses_b', NULL, NULL, 0)")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="locked"):
            OwnershipReader(db).session_process_ownership(["inp_a"], [], [])
        assert time.monotonic() - started >= 0.9  # waited out the busy timeout
    finally:
        locker.close()
    assert OwnershipReader(db).session_process_ownership([], [], []).gaps == ()


def test_reader_never_writes(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
        store.register_input("inp_a", "ses_a")
    reader = OwnershipReader(db)
    before = db.stat().st_mtime_ns, db.stat().st_size
    assert reader.session_process_ownership(["inp_a"], [], []).inputs == {"inp_a": "ses_a"}
    assert (db.stat().st_mtime_ns, db.stat().st_size) == before


def test_busy_timeout_below_one_second_is_refused(db: Path) -> None:
    with pytest.raises(ValueError, match="1 s"):
        OwnershipReader(db, busy_timeout_s=0.5)


def test_each_question_reads_the_keys_asked_and_sees_every_commit(db: Path) -> None:
    # The store keeps no cache of its own: the reader asks only what is new
    # while the version stays (tests/reader/test_reader_incremental.py counts that).
    with OwnershipStore(db) as store:
        store.register_session("ses_a", context_id="ctx_a")
        store.register_input("inp_a", "ses_a")
    reader = OwnershipReader(db)
    try:
        first = reader.session_process_ownership(["inp_a", "inp_b"], [], [10, 11])
        assert first.inputs == {"inp_a": "ses_a"} and reader.queries == 1
        assert first.contexts == {"ses_a": "ctx_a"}
        again = reader.session_process_ownership(["inp_a", "inp_b"], [], [10, 11])
        assert again == first and reader.queries == 2
        nothing = reader.session_process_ownership([], [], [])
        assert nothing == Ownership() and reader.queries == 2  # no key: no table read
        version = reader.version()
        with OwnershipStore(db) as store:
            store.register_session("ses_b", context_id="ctx_b")
            store.register_input("inp_b", "ses_b")
        assert reader.version() != version
        after = reader.session_process_ownership(["inp_a", "inp_b"], [], [10, 11])
        assert after.inputs == {"inp_a": "ses_a", "inp_b": "ses_b"}
        assert after.contexts == {"ses_a": "ctx_a", "ses_b": "ctx_b"}
        assert reader.queries == 3
    finally:
        reader.close()


def test_a_replaced_store_is_read_afresh(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_old")
        store.register_input("inp_a", "ses_old")
    reader = OwnershipReader(db)
    try:
        assert reader.session_process_ownership(["inp_a"], [], []).inputs == {"inp_a": "ses_old"}
        for path in db.parent.glob("capsule.db*"):
            path.unlink()
        missing = reader.session_process_ownership(["inp_a"], [], [])
        assert missing.inputs == {} and "does not exist" in missing.gaps[0]
        with OwnershipStore(db) as store:
            store.register_session("ses_new")
            store.register_input("inp_a", "ses_new")
        assert reader.session_process_ownership(["inp_a"], [], []).inputs == {"inp_a": "ses_new"}
    finally:
        reader.close()


def test_ensure_session_keeps_what_is_not_given_again(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.ensure_session("ses_a", context_id="ctx", title="first")
        store.ensure_session("ses_a")  # `capsulectl run --session ses_a` without a title
        store.ensure_session("ses_a", title="second")
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT context_id, title FROM sessions").fetchall()
    assert rows == [("ctx", "second")]


def test_release_process_drops_only_that_row(db: Path) -> None:
    with OwnershipStore(db) as store:
        store.register_session("ses_a")
        store.register_process(100, "ses_a", started_at_s=1000)
        store.register_process(101, "ses_a", started_at_s=1000)
        assert store.release_process(100, 1000)
        assert not store.release_process(100, 1000)
        assert not store.release_process(101, 999)  # another start: another process
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT pid FROM session_processes").fetchall() == [(101,)]
