"""The reader against hostile and broken files: gaps, never crashes or hangs.

The rules are docs/design.md §2, §3 and §5.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from helpers.processes import sleepers
from helpers.world import CheckHook, OwnershipMovingOnce, World, make_home, pids

from capsule_client.kit.receipts import MAX_RECEIPT_BYTES, process_start_time
from capsuled.home.strictness import user_name
from capsuled.reader import (
    GAP_CATCHING_UP,
    GAP_MOVED,
    GAP_TOO_MANY_ERRORS,
    MAX_ERRORS,
    ActiveSessionReader,
    ObservationCancelled,
)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


def gaps_for(gaps: Iterable[str], path: Path) -> list[str]:
    return [gap.removeprefix(f"{path}: ") for gap in gaps if gap.startswith(f"{path}: ")]


def exec_json(pid: int, exec_id: str = "e", **fields: object) -> str:
    values = {"schema_version": 1, "exec_id": exec_id, "pid": pid, "started_at": 0, **fields}
    return "{" + ",".join(f'"{k}": {v!r}'.replace("'", '"') for k, v in values.items()) + "}"


def test_broken_receipts_are_gaps_naming_path_and_reason(world: World) -> None:
    good = world.pool.start()
    start = round(process_start_time(good.pid))
    execs = world.home / "runtime/exec-processes"
    clients = world.home / "runs/run1/inp_a/provider-clients"
    execs.mkdir(parents=True)
    clients.mkdir(parents=True)
    broken = {
        execs / "json.json": ("{not json", "invalid exec receipt: JSON is malformed"),
        execs / "types.json": (exec_json(good.pid, started_at="now"), "Expected `int`"),
        execs / "version.json": (
            exec_json(good.pid, schema_version=2, started_at=start),
            "unsupported schema_version 2 (expected 1)",
        ),
        execs / "pid.json": (exec_json(1, started_at=start), "Expected `int` >= 2"),
        execs / "big.json": (" " * MAX_RECEIPT_BYTES + "{}", f"larger than {MAX_RECEIPT_BYTES}"),
        clients / "offset.json": (
            f'{{"schema_version": 1, "pid": {good.pid}, "started_at": "2026-01-01T00:00:00"}}',
            "timezone",
        ),
    }
    for path, (text, _) in broken.items():
        path.write_text(text)
    world.exec_receipt("exe_good", good.pid)

    snapshot = world.ready()

    assert [p.exec_id for p in snapshot.unowned] == ["exe_good"]
    for path, (_, reason) in broken.items():
        (gap,) = gaps_for(snapshot.gaps, path)
        assert reason in gap


def test_an_invalid_input_directory_is_a_gap(world: World) -> None:
    process = world.pool.start()
    world.client_receipt("inp_ok", process.pid)
    bad_dir = world.home / "runs/run1/not-an-input"
    (bad_dir / "provider-clients").mkdir(parents=True)
    (bad_dir / "provider-clients/c.json").write_bytes(
        (world.home / "runs/run1/inp_ok/provider-clients/c1.json").read_bytes()
    )
    snapshot = world.ready()
    assert pids(snapshot) == {"unowned": [("provider_client", process.pid)]}
    (gap,) = gaps_for(snapshot.gaps, bad_dir)
    assert "'not-an-input' is not an input id" in gap


def test_hidden_files_and_non_receipts_are_never_read(world: World) -> None:
    process = world.pool.start()
    receipt = world.client_receipt("inp_a", process.pid).read_bytes()
    input_dir = world.home / "runs/run1/inp_a"
    (input_dir / "manifest.json").write_text("{broken")
    (input_dir / "provider-clients/.hidden.json").write_text("{broken")
    (input_dir / "provider-clients/notes.txt").write_text("{broken")
    (input_dir / "provider-clients/deeper").mkdir()
    (input_dir / "provider-clients/deeper/x.json").write_text("{broken")
    (input_dir / "other").mkdir()
    (input_dir / "other/x.json").write_text("{broken")
    (world.home / "runs/.hidden-run/inp_b/provider-clients").mkdir(parents=True)
    (world.home / "runs/.hidden-run/inp_b/provider-clients/c.json").write_bytes(receipt)
    (world.home / "runs/run1/inp_a/provider-clients.json").write_text("{broken")
    (world.home / "runtime/exec-processes").mkdir(parents=True)
    (world.home / "runtime/exec-processes/.x.json.tmp").write_text("{broken")
    (world.home / "runtime/exec-processes/.x.json").write_text("{broken")

    snapshot = world.ready()

    assert snapshot.gaps == [
        f"ownership store {world.store_path} does not exist; nobody owns anything"
    ]
    assert pids(snapshot) == {"unowned": [("provider_client", process.pid)]}
    # Only the receipt's bytes were read (three times: it is new, so the stat
    # check does not trust it yet); any broken file read would add 7 bytes.
    assert snapshot.cost.bytes % len(receipt) == 0


def test_a_fifo_named_like_a_receipt_does_not_block(world: World) -> None:
    execs = world.home / "runtime/exec-processes"
    clients = world.home / "runs/run1/inp_a/provider-clients"
    execs.mkdir(parents=True)
    clients.mkdir(parents=True)
    os.mkfifo(execs / "x.json")
    os.mkfifo(clients / "x.json")
    os.mkfifo(world.home / "runtime/opencode-servers.json")

    snapshot = world.ready()  # would hang on open() without O_NONBLOCK

    for fifo in (execs / "x.json", clients / "x.json"):
        assert gaps_for(snapshot.gaps, fifo) == ["not a regular file"]
    world.feed.add([execs / "x.json"])
    assert gaps_for(world.ready().gaps, execs / "x.json") == ["not a regular file"]


def test_symlinks_are_not_followed(world: World, tmp_path: Path) -> None:
    process = world.pool.start()
    outside = tmp_path / "outside.json"
    outside.write_bytes(world.exec_receipt("exe_real", process.pid).read_bytes())
    (world.home / "runtime/exec-processes/link.json").symlink_to(outside)
    clients = world.home / "runs/run1/inp_a/provider-clients"
    clients.mkdir(parents=True)
    (world.home / "runs/run2").symlink_to(world.home / "runs/run1")  # a linked run

    snapshot = world.ready()

    assert [p.exec_id for p in snapshot.unowned] == ["exe_real"]
    link = world.home / "runtime/exec-processes/link.json"
    assert gaps_for(snapshot.gaps, link) == ["is a symbolic link; receipts are not followed"]


@pytest.mark.timeout(10)
def test_a_symlink_loop_under_runs_does_not_hang_the_walk(world: World) -> None:
    process = world.pool.start()
    receipt = world.client_receipt("inp_a", process.pid)
    clients = receipt.parent
    (world.home / "runs/loop").symlink_to(world.home / "runs")
    (world.home / "runs/run1/loop").symlink_to(".")
    (world.home / "runs/run1/inp_a/loop").symlink_to("..")
    (clients / "loop.json").symlink_to("loop.json")  # ELOOP itself
    os.symlink("../provider-clients", clients / "up")

    snapshot = world.ready()

    assert pids(snapshot) == {"unowned": [("provider_client", process.pid)]}
    assert gaps_for(snapshot.gaps, clients / "loop.json") == [
        "is a symbolic link; receipts are not followed"
    ]
    assert snapshot.cost.directories == 4  # runs, run1, inp_a, provider-clients; once each


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_another_users_receipt_is_refused(world: World) -> None:
    process = world.pool.start()
    path = world.exec_receipt("exe_1", process.pid)
    os.chown(path, 65534, 65534)
    snapshot = world.ready()
    assert snapshot.unowned == []
    assert gaps_for(snapshot.gaps, path) == [
        f"owned by uid 65534, not {os.geteuid()}; another user's receipt is refused"
    ]
    os.chown(path, os.geteuid(), os.getegid())  # ctime moves: the stat check re-reads it
    snapshot = world.ready()
    assert [p.exec_id for p in snapshot.unowned] == ["exe_1"]
    assert gaps_for(snapshot.gaps, path) == []


def test_a_repaired_receipt_loses_its_gap(world: World) -> None:
    process = world.pool.start()
    path = world.home / "runtime/exec-processes/exe_1.json"
    path.parent.mkdir(parents=True)
    path.write_text("{")
    assert len(gaps_for(world.ready().gaps, path)) == 1
    world.exec_receipt("exe_1", process.pid)
    world.feed.add([path])
    snapshot = world.ready()
    assert gaps_for(snapshot.gaps, path) == []
    assert [p.exec_id for p in snapshot.unowned] == ["exe_1"]


def write_bad_receipts(directory: Path, count: int, name_length: int = 8) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (directory / f"{i:0{name_length}}.json").write_text("{")


def test_too_many_errors_make_the_observation_unavailable(world: World) -> None:
    execs = world.home / "runtime/exec-processes"
    write_bad_receipts(execs, MAX_ERRORS)
    snapshot = world.observe()
    assert snapshot.discovery == "ready"
    assert len(snapshot.gaps) == MAX_ERRORS + 1  # and the missing store

    (execs / "one-more.json").write_text("{")
    world.feed.add([execs / "one-more.json"])
    snapshot = world.observe()
    assert snapshot.discovery == "unavailable"
    assert snapshot.gaps == [GAP_TOO_MANY_ERRORS]
    assert snapshot.sessions == snapshot.unowned == []

    (execs / "one-more.json").unlink()
    assert world.observe().discovery == "ready"  # a failed observation owes a rescan


def test_too_many_error_bytes_make_the_observation_unavailable(tmp_path: Path) -> None:
    # 2,500 errors (under the count bound) whose paths are ~1.7 KiB long: over 4 MiB.
    home = tmp_path
    for _ in range(6):
        home = home / ("h" * 250)
    reader = ActiveSessionReader(make_home(home))
    write_bad_receipts(home / "runtime/exec-processes", 2500, name_length=200)
    snapshot = reader.observe().snapshot
    assert snapshot.discovery == "unavailable"
    assert snapshot.gaps == [GAP_TOO_MANY_ERRORS]


def test_cancellation_between_reads(world: World) -> None:
    process = world.pool.start()
    for i in range(20):
        world.exec_receipt(f"exe_{i:02}", process.pid)
    hook = CheckHook(6, lambda: hook.set())
    reader = ActiveSessionReader(world.home, world.feed, cancel=hook)

    with pytest.raises(ObservationCancelled):
        reader.observe()
    assert hook.checks == 6  # stopped at the first check after the event was set
    assert reader._cost.receipts < 20

    hook.clear()
    snapshot = reader.observe().snapshot
    assert snapshot.discovery == "ready"
    assert len(snapshot.unowned) == 20
    assert snapshot.cost.rescans == 1  # a cancelled observation owes a rescan


def test_a_cancel_set_before_the_observation_reads_nothing(world: World) -> None:
    cancel = threading.Event()
    cancel.set()
    reader = ActiveSessionReader(world.home, world.feed, cancel=cancel)
    with pytest.raises(ObservationCancelled):
        reader.observe()
    assert reader._cost.receipts == reader._cost.directories == 0


def test_a_receipt_arriving_during_the_observation_means_scanning(world: World) -> None:
    first, second = world.pool.start(), world.pool.start()
    world.own("ses_a", execs=["exe_1", "exe_2"])
    world.ready()
    path1 = world.exec_receipt("exe_1", first.pid)
    world.feed.add([path1])
    path2 = world.home / "runtime/exec-processes/exe_2.json"

    def second_receipt_arrives() -> None:
        world.exec_receipt("exe_2", second.pid)
        world.feed.add([path2])

    # Check 1: the observation starts; check 2: reading exe_1.json.
    world.reader._receipts._cancel = CheckHook(2, second_receipt_arrives)
    snapshot = world.observe()
    assert snapshot.discovery == "scanning"
    assert snapshot.gaps[-1] == GAP_MOVED
    assert snapshot.sessions == []

    snapshot = world.ready()
    assert pids(snapshot) == {"ses_a": [("exec", first.pid), ("exec", second.pid)]}
    assert snapshot.cost.dirty_paths == 1  # the moved path was kept pending


def test_a_rescan_requested_during_the_observation_means_catching_up(world: World) -> None:
    process = world.pool.start()
    world.ready()
    world.feed.add([world.exec_receipt("exe_1", process.pid)])
    world.reader._receipts._cancel = CheckHook(2, world.feed.request_rescan)
    snapshot = world.observe()
    assert snapshot.discovery == "scanning"
    assert snapshot.gaps[-1] == GAP_CATCHING_UP
    snapshot = world.ready()
    assert snapshot.cost.rescans == 1
    assert [p.exec_id for p in snapshot.unowned] == ["exe_1"]


def test_ownership_moving_during_the_observation_means_scanning(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a")
    world.exec_receipt("exe_1", process.pid)
    reader = ActiveSessionReader(world.home, world.feed, ownership=OwnershipMovingOnce(world))
    snapshot = reader.observe().snapshot
    assert snapshot.discovery == "scanning"
    assert snapshot.gaps[-1] == GAP_MOVED
    assert snapshot.unowned == []
    snapshot = reader.observe().snapshot
    assert snapshot.discovery == "ready"
    assert pids(snapshot) == {"ses_late": [("exec", process.pid)]}


def test_an_unreadable_store_makes_the_observation_unavailable(world: World) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    world.store_path.write_bytes(b"garbage" * 1000)
    snapshot = world.observe()
    assert snapshot.discovery == "unavailable"
    assert snapshot.unowned == []
    assert "not a database" in snapshot.gaps[-1]
    world.store_path.unlink()
    world.own("ses_a", execs=["exe_1"])
    assert pids(world.ready()) == {"ses_a": [("exec", process.pid)]}


def test_a_symlinked_receipt_place_is_not_followed(world: World, tmp_path: Path) -> None:
    process = world.pool.start()
    elsewhere = make_home(tmp_path / "elsewhere")
    world.exec_receipt("exe_1", process.pid)
    (world.home / "runtime").rename(elsewhere / "runtime")
    (world.home / "runtime").mkdir()
    (world.home / "runtime/exec-processes").symlink_to(elsewhere / "runtime/exec-processes")
    world.reader.invalidate()
    snapshot = world.ready()
    assert snapshot.unowned == []
    assert gaps_for(snapshot.gaps, world.home / "runtime/exec-processes") == [
        "is a symbolic link; not followed"
    ]
    # reported by a watcher that followed a symlink: still not followed
    clients = elsewhere / "inp_x/provider-clients"
    write_provider = world.client_receipt("inp_x", process.pid, run="real")
    clients.mkdir(parents=True)
    write_provider.rename(clients / "c.json")
    (world.home / "runs/linked").mkdir(parents=True)
    (world.home / "runs/linked/inp_x").symlink_to(elsewhere / "inp_x")
    world.feed.add(
        [
            world.home / "runs/linked/inp_x",
            world.home / "runs/linked/inp_x/provider-clients",
            world.home / "runs/linked/inp_x/provider-clients/c.json",
        ]
    )
    snapshot = world.ready()
    assert snapshot.unowned == []
    assert snapshot.cost.rescans == 0
    assert snapshot.cost.receipts == 0


def test_a_symlinked_runtime_is_not_followed_to_its_receipts(world: World, tmp_path: Path) -> None:
    """Not the last component: ``runtime`` itself is the link."""
    process = world.pool.start()
    elsewhere = make_home(tmp_path / "elsewhere")
    world.exec_receipt("exe_1", process.pid)
    (elsewhere / "runtime").mkdir()
    (world.home / "runtime/exec-processes").rename(elsewhere / "runtime/exec-processes")
    (elsewhere / "runtime/opencode-servers.json").write_text(f'[{{"opencode_pid": {process.pid}}}]')
    (world.home / "runtime").rmdir()
    (world.home / "runtime").symlink_to(elsewhere / "runtime")
    world.reader.invalidate()
    snapshot = world.ready()
    assert (snapshot.unowned, snapshot.servers) == ([], [])
    assert gaps_for(snapshot.gaps, world.home / "runtime") == ["is a symbolic link; not followed"]
    # A verification does not mistake the linked place for a receipt directory to walk.
    verified = world.reader.observe(verify_barrier_ns=time.time_ns())
    assert verified.snapshot.cost.rescans == 0
    assert verified.snapshot.discovery == "ready"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_home_owned_by_another_user_is_refused(world: World) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    os.chown(world.home, 65534, 65534)
    snapshot = world.observe()
    assert snapshot.discovery == "unavailable"
    assert snapshot.gaps == [
        f"the home {world.home} is owned by {user_name(65534)}, not by {user_name(os.geteuid())} "
        "who runs capsuled: receipts are claims of ownership, so capsuled reads only a "
        "home of its own user. Fix: use your own home (--home or CAPSULE_HOME), or "
        f"`chown {os.geteuid()} {world.home} && chmod 0700 {world.home}`"
    ]
    os.chown(world.home, os.geteuid(), os.getegid())
    assert [p.exec_id for p in world.ready().unowned] == ["exe_1"]
