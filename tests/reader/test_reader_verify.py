"""Verification, the net under the watch (docs/design.md §5): with the watch trusted and
nothing reported, a verifying observation finds what the watch missed, re-reads only what
differs, and counts as missed only changes older than its barrier."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import sleepers
from helpers.world import World

from capsuled.reader import ActiveSessionReader, Observation
from capsuled.reader.listings import RACY_MARGIN_NS


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


def trusting(world: World) -> ActiveSessionReader:
    """A reader that trusts the watch, over a home whose receipt directories exist."""
    (world.home / "runtime" / "exec-processes").mkdir(parents=True, exist_ok=True)
    (world.home / "runs").mkdir(exist_ok=True)
    return ActiveSessionReader(world.home, world.feed, trust_watcher=True)


def verify(reader: ActiveSessionReader, barrier_ns: int | None = None) -> Observation:
    """A verifying observation; by default one whose barrier comes later than every
    change made so far by more than the racy margin (a ctime cannot be set back)."""
    if barrier_ns is None:
        barrier_ns = time.time_ns() + RACY_MARGIN_NS + 1
    return reader.observe(verify_barrier_ns=barrier_ns)


def age(path: Path, seconds: float = 5.0) -> None:
    """Make a change look older than a barrier taken now (mtime; ctime follows the utime)."""
    past = time.time() - seconds
    os.utime(path, (past, past), follow_symlinks=False)


def test_nothing_changed_reads_nothing_and_finds_nothing(world: World) -> None:
    process = world.pool.start()
    age(world.exec_receipt("exe_live", process.pid))  # older than the racy window
    for n in range(200):  # stale: their pids are long gone
        world.exec_receipt(f"exe_stale{n}", process.pid, started_at_s=1_000_000.0 + n)
    reader = trusting(world)
    assert len(reader.observe().snapshot.unowned) == 1
    verified = verify(reader)
    assert verified.verified is not None
    assert verified.verified.missed == []
    # A stat per directory and per candidate, never a read of a stale receipt (the
    # live one may be re-read: it was written less than the racy window ago).
    assert verified.snapshot.cost.receipts <= 1
    assert verified.verified.checked < 10


def test_a_receipt_created_without_an_event_is_found(world: World) -> None:
    process = world.pool.start()
    reader = trusting(world)
    assert reader.observe().snapshot.unowned == []
    path = world.exec_receipt("exe_unreported", process.pid)
    age(path.parent)
    assert reader.observe().snapshot.unowned == []  # trusted: nothing was reported
    verified = verify(reader)
    assert [p.pid for p in verified.snapshot.unowned] == [process.pid]
    assert verified.verified is not None
    assert verified.verified.missed == [str(path)]


def test_a_candidate_rewritten_in_place_is_found(world: World) -> None:
    """A rewrite through a hard link elsewhere makes no event in the receipt's directory."""
    first, second = world.pool.start(), world.pool.start()
    path = world.exec_receipt("exe_1", first.pid, command="first")
    outside = world.home.parent / "elsewhere.json"
    os.link(path, outside)
    reader = trusting(world)
    reader.observe()
    time.sleep(0.01)  # a later mtime tick than the first write
    donor = world.exec_receipt("exe_donor", second.pid, command="rewritten")
    outside.write_bytes(donor.read_bytes())  # in place: same inode as the receipt
    donor.unlink()
    age(path.parent)
    verified = verify(reader)
    assert [(p.pid, p.receipt_command) for p in verified.snapshot.unowned] == [
        (second.pid, "rewritten")
    ]
    assert verified.verified is not None
    assert str(path) in verified.verified.missed


def test_a_receipt_removed_without_an_event_is_found(world: World) -> None:
    process = world.pool.start()
    path = world.exec_receipt("exe_1", process.pid)
    reader = trusting(world)
    assert len(reader.observe().snapshot.unowned) == 1
    path.unlink()
    age(path.parent)
    verified = verify(reader)
    assert verified.snapshot.unowned == []
    assert verified.verified is not None
    assert verified.verified.missed == [str(path)]


def test_a_new_run_directory_without_an_event_is_found(world: World) -> None:
    process = world.pool.start()
    reader = trusting(world)
    reader.observe()
    path = world.client_receipt("inp_new", process.pid, run="run_unreported")
    for directory in (path.parent, path.parent.parent, path.parent.parent.parent):
        age(directory)
    age(world.home / "runs")
    answer = verify(reader).snapshot
    # A new run directory asks for a walk, as an event for it would: catching up first.
    while answer.discovery == "scanning":
        answer = reader.observe().snapshot
    assert [p.pid for p in answer.unowned] == [process.pid]


def test_a_change_younger_than_the_barrier_is_read_but_not_counted(world: World) -> None:
    """Its event may still be on its way through the watch: not a miss."""
    process = world.pool.start()
    reader = trusting(world)
    reader.observe()
    barrier_ns = time.time_ns() - 1_000_000_000  # the barrier was a second ago
    world.exec_receipt("exe_young", process.pid)
    verified = verify(reader, barrier_ns)
    assert [p.pid for p in verified.snapshot.unowned] == [process.pid]
    assert verified.verified is not None
    assert verified.verified.missed == []


def test_hidden_files_and_noise_are_not_misses(world: World) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    reader = trusting(world)
    reader.observe()
    exec_dir = world.home / "runtime" / "exec-processes"
    (exec_dir / ".e.json.tmp").write_text("{}")
    (exec_dir / "notes.txt").write_text("not a receipt")
    age(exec_dir)
    verified = verify(reader)
    assert verified.verified is not None
    assert verified.verified.missed == []
    assert len(verified.snapshot.unowned) == 1


def test_a_symlink_made_without_an_event_changes_nothing(world: World) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    reader = trusting(world)
    before = reader.observe().snapshot
    inp = world.home / "runs" / "run1" / "inp_a"
    inp.mkdir(parents=True)
    (inp / "cwd").symlink_to(world.home)
    (inp / "provider-clients").symlink_to(world.home / "runtime" / "exec-processes")
    answer = verify(reader).snapshot
    while answer.discovery == "scanning":
        answer = reader.observe().snapshot
    assert [p.pid for p in answer.unowned] == [p.pid for p in before.unowned]


def test_a_reported_run_rewritten_after_the_barrier_is_not_a_miss(world: World) -> None:
    """The watch reported a new run, so it was listed then, but the listing of ``runs``
    still lacks it: the next verification finds ``runs`` differing. A receipt in the run
    rewritten in place after the barrier is a young change, not one the watch missed."""
    process = world.pool.start()
    reader = trusting(world)
    reader.observe()
    path = world.client_receipt("inp_a", process.pid, provider="one")
    run = world.home / "runs" / "run1"
    for directory in (path.parent, path.parent.parent, run, run.parent):
        age(directory)
    world.feed.add([run])
    assert [p.provider for p in reader.observe().snapshot.unowned] == ["one"]

    barrier_ns = time.time_ns() + RACY_MARGIN_NS + 1  # every change so far is older
    path.write_bytes(path.read_bytes().replace(b'"one"', b'"two"'))  # in place: same inode
    later = (barrier_ns + 1_000_000_000) / 1e9  # the rewrite's mtime: after the barrier
    os.utime(path, (later, later))
    verified = verify(reader, barrier_ns)
    assert verified.verified is not None
    assert verified.verified.missed == []
    assert [p.provider for p in verified.snapshot.unowned] == ["two"]


def test_a_change_still_carrying_the_stamps_it_was_read_with_is_not_dated(tmp_path: Path) -> None:
    """A ``stat`` during ``open(O_TRUNC)`` sees the new size before the new times: a change
    whose file still has the stamps of the version read before cannot be dated, so it is
    not counted as missed (the watch reports it once the write ends)."""
    from capsuled.reader.verification import _changed_before

    path = tmp_path / "c1.json"
    path.write_bytes(b"{}")
    st = os.lstat(path)
    read_with = (st.st_mtime_ns, st.st_ctime_ns)
    later = time.time_ns() + 10 * RACY_MARGIN_NS
    assert not _changed_before(str(path), read_with, later)
    assert _changed_before(str(path), (st.st_mtime_ns - 1, st.st_ctime_ns), later)
    assert _changed_before(str(path), None, later)
    assert not _changed_before(str(path), (0, 0), st.st_ctime_ns)  # younger than the moment
    path.unlink()  # gone: dated by its directory, as before
    assert _changed_before(str(path), read_with, later)
