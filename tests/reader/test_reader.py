"""The active-sessions reader: liveness, ownership, the incremental cache.

The rules are docs/design.md §3-§5 (the reader ports the original Rust reader).

Real ``sleep`` processes, real receipts written with the writer kit, the real
ownership store; changes reach the reader through the real ``ChangeFeed``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from helpers.processes import sleepers
from helpers.waits import wait_until
from helpers.world import OwnershipMovingOnce, World, pids

from capsule_client.kit.receipts import (
    ExecReceipt,
    ProviderClientReceipt,
    exec_receipt_path,
    process_start_time,
    provider_client_receipt_path,
)
from capsule_client.wire import ServerEntry, SessionProcess
from capsuled.reader import (
    GAP_CATCHING_UP,
    GAP_HOME_REPLACED,
    GAP_MOVED,
    GAP_TOO_MANY_ERRORS,
    ActiveSessionReader,
)
from capsuled.service.home_setup import check_home
from capsuled.startup_errors import UnsafeHome


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


def test_empty_home_is_ready_and_says_the_store_is_missing(world: World) -> None:
    snapshot = world.ready()
    assert snapshot.sessions == snapshot.unowned == snapshot.servers == []
    assert snapshot.gaps == [
        f"ownership store {world.store_path} does not exist; nobody owns anything"
    ]
    assert snapshot.home == str(world.home)
    assert snapshot.cost.rescans == 1


def test_missing_home_is_ready_and_empty_and_says_so(tmp_path: Path) -> None:
    home = tmp_path / "not-yet"
    reader = ActiveSessionReader(home)
    observation = reader.observe(task="t1")
    snapshot = observation.snapshot
    assert snapshot.discovery == "ready"
    assert snapshot.task == "t1"
    assert snapshot.sessions == snapshot.unowned == []
    missing = f"home {home} does not exist; no receipts are read until it is created"
    assert snapshot.gaps[0] == missing
    assert not observation.home_replaced
    home.mkdir(mode=0o700)
    after = reader.observe().snapshot
    assert missing not in after.gaps
    assert after.generation > snapshot.generation


def test_receipts_and_store_project_into_sessions(world: World) -> None:
    client, tool, shell, stray = (world.pool.start() for _ in range(4))
    world.client_receipt("inp_a", client.pid, provider="opencode")
    world.exec_receipt("exe_1", tool.pid, command="make test")
    world.exec_receipt("exe_stray", stray.pid)
    world.own("ses_b", execs=["exe_1"], context_id="ctx_b")
    world.own("ses_a", inputs=["inp_a"], pids=[shell.pid], context_id="ctx_a")

    snapshot = world.ready()

    assert [s.session_id for s in snapshot.sessions] == ["ses_a", "ses_b"]
    ses_a, ses_b = snapshot.sessions
    assert ses_a.context_id == "ctx_a"
    assert ses_a.processes[0] == SessionProcess(
        kind="process", pid=shell.pid, started_at=ses_a.processes[0].started_at
    )
    provider = ses_a.processes[1]
    assert (provider.kind, provider.pid, provider.input_id, provider.provider) == (
        "provider_client",
        client.pid,
        "inp_a",
        "opencode",
    )
    assert provider.receipt == "runs/run1/inp_a/provider-clients/c1.json"
    assert ses_b.context_id == "ctx_b"
    assert [(p.kind, p.pid, p.exec_id, p.receipt_command) for p in ses_b.processes] == [
        ("exec", tool.pid, "exe_1", "make test")
    ]
    assert [(p.kind, p.pid, p.exec_id) for p in snapshot.unowned] == [
        ("exec", stray.pid, "exe_stray")
    ]
    assert snapshot.gaps == []


def test_receipts_naming_one_process_share_its_numbers(world: World) -> None:
    """Memory: thousands of receipts may name a few processes; their pid and start
    time are kept once, not once per receipt (docs/benchmarks.md, scenario 7)."""
    shared = world.pool.start()
    for n in range(3):
        world.exec_receipt(f"exe_{n}", shared.pid)
        world.client_receipt("inp_a", shared.pid, client=f"c{n}")

    processes = world.ready().unowned

    assert len(processes) == 6
    first = processes[0]
    assert all(p.pid is first.pid and p.started_at is first.started_at for p in processes)


def test_a_reused_pid_is_not_live(world: World) -> None:
    process = world.pool.start()
    start = process_start_time(process.pid)
    world.exec_receipt("exe_reused", process.pid, started_at_s=start - 60)
    world.exec_receipt("exe_edge", process.pid, started_at_s=start - 2.4)
    world.exec_receipt("exe_past", process.pid, started_at_s=start + 4)
    world.client_receipt("inp_a", process.pid, client="reused", started_at_s=start + 30)
    world.client_receipt("inp_a", process.pid, client="edge", started_at_s=start - 4.5)
    world.client_receipt("inp_a", process.pid, client="past", started_at_s=start + 5.5)
    with world.store() as store:
        store.register_session("ses_a")  # a store row for the pid with another start time
        store.register_process(process.pid, "ses_a", started_at_s=start - 100)

    snapshot = world.ready()

    assert snapshot.sessions == []
    assert sorted(str(p.receipt) for p in snapshot.unowned) == [
        "runs/run1/inp_a/provider-clients/edge.json",
        "runtime/exec-processes/exe_edge.json",
    ]


def test_a_killed_process_leaves_the_next_observation(world: World) -> None:
    keep, doomed, zombie = world.pool.start(), world.pool.start(), world.pool.start()
    for process in (keep, doomed, zombie):
        world.exec_receipt(f"exe_{process.pid}", process.pid)
    world.own("ses_a", execs=[f"exe_{p.pid}" for p in (keep, doomed, zombie)])
    assert len(world.ready().sessions[0].processes) == 3

    world.pool.kill(doomed)
    world.pool.kill(zombie, reap=False)  # a zombie is not live

    snapshot = world.ready()
    assert pids(snapshot) == {"ses_a": [("exec", keep.pid)]}
    assert snapshot.cost.rescans == 0


def test_a_session_with_only_dead_processes_is_not_active(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a", pids=[process.pid])
    assert pids(world.ready()) == {"ses_a": [("process", process.pid)]}
    world.pool.kill(process)
    assert world.ready().sessions == []


def test_a_receipt_reported_through_the_feed_is_seen_without_a_rescan(world: World) -> None:
    world.ready()
    process = world.pool.start()
    path = world.exec_receipt("exe_new", process.pid)
    world.own("ses_a", execs=["exe_new"])
    world.feed.add([path])

    snapshot = world.ready()

    assert pids(snapshot) == {"ses_a": [("exec", process.pid)]}
    assert snapshot.cost.rescans == 0
    assert snapshot.cost.dirty_paths == 1
    assert snapshot.cost.receipts >= 1


def test_an_unreported_receipt_waits_for_a_rescan(world: World) -> None:
    world.ready()
    process = world.pool.start()
    world.client_receipt("inp_a", process.pid)
    assert world.ready().unowned == []  # the cache only reads what it is told about

    world.reader.invalidate()

    snapshot = world.ready()
    assert pids(snapshot) == {"unowned": [("provider_client", process.pid)]}
    assert snapshot.cost.rescans == 1


def test_a_burst_of_2000_receipts_is_seen_in_full(world: World) -> None:
    world.ready()
    processes = [world.pool.start() for _ in range(4)]
    starts = {p.pid: process_start_time(p.pid) for p in processes}
    paths = []
    with world.store() as store:
        store.register_session("ses_a")
        for i in range(2000):
            pid = processes[i % 4].pid
            if i % 2:
                path = exec_receipt_path(world.home, f"exe_{i:04}")
                receipt: object = ExecReceipt(1, f"exe_{i:04}", pid, round(starts[pid]))
                store.register_exec(f"exe_{i:04}", "ses_a")
            else:
                path = provider_client_receipt_path(world.home, "burst", f"inp_{i:04}", "c")
                receipt = ProviderClientReceipt(1, pid, datetime.fromtimestamp(starts[pid], tz=UTC))
                store.register_input(f"inp_{i:04}", "ses_a")
            # Written like the kit does (hidden temp + rename) but without its
            # two fsyncs per receipt, which would make this test 10 s long.
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(msgspec.json.encode(receipt))
            tmp.rename(path)
            paths.append(path)
    world.feed.add(paths)

    started = time.monotonic()
    snapshot = world.observe()
    elapsed = time.monotonic() - started

    if snapshot.discovery != "ready":  # the run directory is new: owed a rescan
        snapshot = world.ready()
    assert len(snapshot.sessions[0].processes) == 2000
    assert snapshot.unowned == []
    assert snapshot.cost.retained == 2000
    assert elapsed < 5


def test_a_directory_deleted_and_recreated_is_seen(world: World) -> None:
    old, new = world.pool.start(), world.pool.start()
    world.client_receipt("inp_a", old.pid, client="old")
    world.client_receipt("inp_a", old.pid, client="old2")
    assert pids(world.ready()) == {"unowned": [("provider_client", old.pid)] * 2}

    input_dir = world.home / "runs/run1/inp_a"
    shutil.rmtree(input_dir)
    world.feed.add([input_dir, input_dir / "provider-clients"])
    assert world.ready().unowned == []

    path = world.client_receipt("inp_a", new.pid, client="new")
    world.feed.add([input_dir])  # a watcher may report only the directory

    snapshot = world.ready()
    assert [(p.pid, p.receipt) for p in snapshot.unowned] == [
        (new.pid, "runs/run1/inp_a/provider-clients/new.json")
    ]
    assert snapshot.cost.rescans == 0
    assert path.exists()


def test_a_removed_receipt_leaves_even_if_unreported(world: World) -> None:
    process = world.pool.start()
    path = world.exec_receipt("exe_1", process.pid)
    assert world.ready().unowned != []
    path.unlink()
    assert world.ready().unowned == []


def test_a_new_run_directory_is_listed_in_the_same_observation_without_a_walk(
    world: World,
) -> None:
    process = world.pool.start()
    for n in range(5):  # stale (another start time): read by walks only
        world.exec_receipt(f"exe_stale{n}", process.pid, started_at_s=1_000_000.0 + n)
    reader = ActiveSessionReader(world.home, world.feed, trust_watcher=True)
    reader.observe()
    world.client_receipt("inp_a", process.pid, run="fresh")
    world.feed.add([world.home / "runs/fresh"])
    snapshot = reader.observe().snapshot
    assert snapshot.discovery == "ready"
    assert (snapshot.cost.rescans, snapshot.cost.receipts) == (0, 1)
    assert pids(snapshot) == {"unowned": [("provider_client", process.pid)]}


def test_a_run_directory_replaced_by_another_keeps_nothing_of_the_first(world: World) -> None:
    """Renamed away and another moved in under its name: one changed path, listed afresh."""
    first, second = world.pool.start(), world.pool.start()
    world.client_receipt("inp_a", first.pid, run="run1")
    world.ready()
    staged = world.home / "staged"
    world.client_receipt("inp_b", second.pid, run="run2")
    (world.home / "runs/run1").rename(staged)
    (world.home / "runs/run2").rename(world.home / "runs/run1")
    world.feed.add([world.home / "runs/run1", world.home / "runs/run2"])
    assert pids(world.ready()) == {"unowned": [("provider_client", second.pid)]}


def test_a_path_outside_the_home_forces_a_rescan(world: World, tmp_path: Path) -> None:
    world.ready()
    world.feed.add([tmp_path / "elsewhere"])
    assert world.ready().cost.rescans == 1


def test_changes_that_cannot_matter_are_ignored(world: World) -> None:
    world.own("ses_a")
    world.ready()
    trace = world.home / "sessions/ses_a/trace.jsonl"
    trace.parent.mkdir(parents=True)
    trace.write_text("{}\n")
    manifest = world.home / "runs/run1/inp_a/manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("not json")
    world.feed.add(
        [
            trace,
            manifest,
            world.store_path,
            world.home / "capsule.db-wal",
            world.home / "runtime/exec-processes/.exe_1.json.123.tmp",
        ]
    )
    snapshot = world.ready()
    assert snapshot.cost.rescans == 0
    assert snapshot.cost.dirty_paths == 0
    assert snapshot.cost.receipts == 0
    assert snapshot.gaps == []


def test_a_requested_rescan_walks_from_scratch(world: World) -> None:
    world.ready()
    world.feed.request_rescan()
    first = world.ready()
    assert first.cost.rescans == 1


def test_servers_registry(world: World) -> None:
    live, dead, reused = world.pool.start(), world.pool.start(), world.pool.start()
    registry = world.home / "runtime/opencode-servers.json"
    registry.parent.mkdir(parents=True)
    registry.write_text(
        "["
        f'{{"opencode_pid": {live.pid}, "url": "http://127.0.0.1:4096", "directory": "/w",'
        f' "started_at": {round(process_start_time(live.pid))}}},'
        f'{{"opencode_pid": {dead.pid}}},'
        f'{{"opencode_pid": {reused.pid}, "started_at": 1000}}'
        "]"
    )
    world.pool.kill(dead)
    snapshot = world.ready()
    assert snapshot.servers == [
        ServerEntry(
            pid=live.pid,
            url="http://127.0.0.1:4096",
            directory="/w",
            started_at=round(process_start_time(live.pid)),
        )
    ]

    registry.write_text("{not json")
    world.feed.add([registry])
    snapshot = world.ready()
    assert snapshot.servers == []
    assert [g for g in snapshot.gaps if g.startswith(str(registry))] != []

    registry.write_text(f'[{{"opencode_pid": {reused.pid}}}]')
    world.feed.add([registry])
    snapshot = world.ready()
    assert [s.pid for s in snapshot.servers] == [reused.pid]
    assert not any(g.startswith(str(registry)) for g in snapshot.gaps)


def test_home_replaced_makes_the_observation_unavailable(world: World, tmp_path: Path) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    first = world.ready()

    world.home.rename(tmp_path / "old-home")
    world.home.mkdir(mode=0o700)

    observation = world.reader.observe()
    assert observation.home_replaced
    assert observation.snapshot.discovery == "unavailable"
    assert observation.snapshot.gaps == [GAP_HOME_REPLACED]
    assert observation.snapshot.unowned == []
    assert observation.snapshot.generation == first.generation + 1

    fresh = ActiveSessionReader(world.home, world.feed, generations=world.reader.generations)
    again = fresh.observe().snapshot
    assert again.discovery == "ready"
    assert again.unowned == []
    assert again.generation == first.generation + 2


def test_home_removed_makes_the_observation_unavailable(world: World) -> None:
    world.ready()
    shutil.rmtree(world.home)
    observation = world.reader.observe()
    assert observation.home_replaced
    assert observation.snapshot.gaps == [GAP_HOME_REPLACED]


@pytest.mark.parametrize(("mode", "who"), [(0o770, "group"), (0o707, "others")])
def test_a_home_writable_by_others_is_refused(world: World, mode: int, who: str) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    os.chmod(world.home, mode)
    snapshot = world.observe()
    assert snapshot.discovery == "unavailable"
    assert snapshot.gaps == [
        f"the home {world.home} is writable by {who} (mode {mode:04o}): anyone who can write "
        f"it can make a process look like part of a session. Fix: `chmod 0700 {world.home}`"
    ]
    os.chmod(world.home, 0o700)
    assert [p.pid for p in world.ready().unowned] == [process.pid]


def test_a_refused_home_is_worded_as_at_start(world: World) -> None:
    os.chmod(world.home, 0o777)
    with pytest.raises(UnsafeHome) as caught:
        check_home(world.home)
    assert world.observe().gaps == [str(caught.value)]


def test_a_home_that_became_a_file_is_refused(world: World) -> None:
    world.ready()
    shutil.rmtree(world.home)
    world.home.write_text("not a directory")
    snapshot = world.observe()
    assert snapshot.discovery == "unavailable"
    assert snapshot.gaps == [
        f"the home {world.home} is not a directory; move it away or pass another --home"
    ]


def test_generation_grows_only_when_the_answer_changes(world: World) -> None:
    process = world.pool.start()
    first = world.ready()
    second = world.ready()
    assert second.generation == first.generation
    assert second.observed_at >= first.observed_at

    world.feed.add([world.exec_receipt("exe_1", process.pid)])
    third = world.ready()
    assert third.generation == first.generation + 1

    world.pool.kill(process)
    fourth = world.ready()
    assert fourth.generation == first.generation + 2
    assert world.reader.generations.current == fourth.generation


def test_gap_texts_are_the_specs() -> None:
    assert GAP_CATCHING_UP == "session discovery is catching up with file-system changes"
    assert GAP_MOVED == "session ownership changed during observation; reading again"
    assert GAP_HOME_REPLACED == "home directory was replaced or removed"
    assert GAP_TOO_MANY_ERRORS == (
        "too much unresolved session ownership; repair receipts before retrying"
    )


def test_an_unchanged_observation_reads_no_files(world: World) -> None:
    processes = [world.pool.start() for _ in range(3)]
    for i, process in enumerate(processes):
        world.exec_receipt(f"exe_{i}", process.pid)
        world.client_receipt(f"inp_{i}", process.pid)
    bad = world.home / "runtime/exec-processes/bad.json"
    bad.write_text("{")
    world.ready()

    # Files written less than RACY_WINDOW_NS before they were read are re-read
    # once more; after that, stat is trusted.
    quiet = wait_until(
        lambda: (s := world.ready()).cost.receipts == 0 and s,
        message="an observation without reads",
    )
    assert quiet.cost.bytes == 0
    assert quiet.cost.directories == 0
    assert quiet.cost.process_samples == 1
    assert len(quiet.unowned) == 6
    assert any(g.startswith(str(bad)) for g in quiet.gaps)

    world.pool.kill(processes[0])  # liveness is still decided on the fresh sample
    after = world.ready()
    assert after.cost.receipts == 0
    assert {p.pid for p in after.unowned} == {processes[1].pid, processes[2].pid}

    pid = processes[1].pid
    bad.write_text(f'{{"schema_version":1,"exec_id":"bad","pid":{pid},"started_at":{_start(pid)}}}')
    repaired = world.ready()  # not reported through the feed: found by the stat check
    assert repaired.cost.receipts >= 1
    assert not any(g.startswith(str(bad)) for g in repaired.gaps)
    assert {p.exec_id for p in repaired.unowned if p.kind == "exec"} == {"exe_1", "exe_2", "bad"}


def _start(pid: int) -> int:
    return round(process_start_time(pid))


def test_changes_under_a_symlinked_home_path_are_understood(world: World, tmp_path: Path) -> None:
    link = tmp_path / "home-link"
    link.symlink_to(world.home)
    reader = ActiveSessionReader(link, world.feed)
    assert reader.home == world.home
    reader.observe()
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    world.feed.add([link / "runtime/exec-processes/exe_1.json"])  # as a watcher of the link
    snapshot = reader.observe().snapshot
    assert [p.exec_id for p in snapshot.unowned] == ["exe_1"]
    assert snapshot.cost.rescans == 0


def test_a_scanning_answer_keeps_the_generation_of_the_last_settled_one(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a", execs=["exe_1"])
    world.feed.add([world.exec_receipt("exe_1", process.pid)])
    settled = world.ready()
    world.reader.ownership = OwnershipMovingOnce(world)  # moves during the next observation
    moved = world.observe()
    assert moved.discovery == "scanning"
    assert moved.generation == settled.generation
    again = world.ready()  # the move (a new owner) counts once, the scanning not at all
    assert pids(again) == {"ses_late": [("exec", process.pid)]}
    assert again.generation == settled.generation + 1


@pytest.mark.parametrize("then", ["removed", "replaced-by-a-directory"])
def test_a_symlinked_home_whose_link_changes_is_replaced_though_its_target_remains(
    world: World, tmp_path: Path, then: str
) -> None:
    link = tmp_path / "home-link"
    link.symlink_to(world.home)
    reader = ActiveSessionReader(link, world.feed)
    assert reader.observe().snapshot.discovery == "ready"
    link.unlink()
    if then == "replaced-by-a-directory":
        link.mkdir(mode=0o700)
    # world.home, the old target, is still there: the link is what was replaced.
    assert reader.observe().home_replaced
