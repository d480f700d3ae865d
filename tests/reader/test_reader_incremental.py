"""Incremental observations: what did not change is not redone, and the answer is
the same as a walk from scratch would give.

The rules are docs/design.md §5.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import msgspec
import pytest
from helpers.processes import sleepers
from helpers.world import World, pids

from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.reader import ActiveSessionReader
from capsuled.reader.store import Ownership, OwnershipReader


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


class CountingOwnership(OwnershipReader):
    """The real store reader, counting the questions asked of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: list[tuple[int, int, int]] = []

    def session_process_ownership(
        self, inputs: Iterable[str], execs: Iterable[str], pids: Iterable[int] | None
    ) -> Ownership:
        inputs, execs = list(inputs), list(execs)
        pids = None if pids is None else list(pids)
        self.calls.append((len(inputs), len(execs), -1 if pids is None else len(pids)))
        return super().session_process_ownership(inputs, execs, pids)


def trusting(world: World, **kwargs: object) -> ActiveSessionReader:
    return ActiveSessionReader(world.home, world.feed, trust_watcher=True, **kwargs)  # type: ignore[arg-type]


def answer(snapshot: ActiveSessionsSnapshot) -> object:
    """What the generation counts: everything but observed_at, generation, task and cost."""
    data = msgspec.to_builtins(snapshot)
    for volatile in ("observed_at", "generation", "task", "cost"):
        del data[volatile]
    return data


def test_a_trusting_reader_reads_only_what_the_feed_reports(world: World) -> None:
    process = world.pool.start()
    path = world.exec_receipt("exe_1", process.pid, command="first")
    reader = trusting(world)
    assert reader.observe().snapshot.unowned[0].receipt_command == "first"

    world.exec_receipt("exe_1", process.pid, command="second")  # not reported
    quiet = reader.observe().snapshot
    assert quiet.cost.receipts == 0
    assert quiet.unowned[0].receipt_command == "first"  # trusted: the watcher would have said

    world.feed.add([path])
    fed = reader.observe().snapshot
    assert fed.cost.receipts == 1
    assert fed.unowned[0].receipt_command == "second"

    world.exec_receipt("exe_1", process.pid, command="third")
    reader.invalidate()  # the periodic rescan is the net under a lost event
    assert reader.observe().snapshot.unowned[0].receipt_command == "third"


def test_an_exit_drops_receipts_without_reading_them(world: World) -> None:
    first, second = world.pool.start(), world.pool.start()
    for i in range(3):
        world.exec_receipt(f"exe_a{i}", first.pid)
        world.exec_receipt(f"exe_b{i}", second.pid)
    reader = trusting(world)
    assert len(reader.observe().snapshot.unowned) == 6
    world.pool.kill(first)
    after = reader.observe().snapshot
    assert after.cost.receipts == 0
    assert {p.pid for p in after.unowned} == {second.pid}
    assert len(after.unowned) == 3


def test_an_observation_woken_by_a_change_reads_only_the_stat_of_the_pids_it_names(
    world: World,
) -> None:
    """docs/design.md §5: an observation woken by a change costs O(the change); the
    processes held by a pidfd that has not turned readable are not read at all."""
    kept = [world.pool.start() for _ in range(3)]
    for i, process in enumerate(kept):
        world.exec_receipt(f"exe_{i}", process.pid)
    reader = trusting(world)
    pidfds: list[int] = []

    def hold(watched: Mapping[int, float] | None) -> None:
        """What the daemon's exit watch does with an observation's ``watched``."""
        assert watched is not None
        for fd in pidfds:
            os.close(fd)
        pidfds[:] = []
        held = {}
        for pid, start in watched.items():
            pidfds.append(os.pidfd_open(pid))
            held[pid] = (start, pidfds[-1])
        reader.held = held

    try:
        walked = reader.observe()
        assert walked.snapshot.cost.process_stats >= len(kept)  # a walk reads the whole table
        hold(walked.watched)

        newcomer = world.pool.start()
        world.feed.add([world.exec_receipt("exe_new", newcomer.pid)])
        fed = reader.observe()
        assert {p.pid for p in fed.snapshot.unowned} == {newcomer.pid, *(p.pid for p in kept)}
        assert (fed.snapshot.cost.process_samples, fed.snapshot.cost.process_stats) == (1, 1)
        hold(fed.watched)

        world.pool.kill(kept[0])  # its pidfd turns readable
        world.feed.add([])  # a wake with no path, as an exit's
        gone = reader.observe().snapshot
        assert kept[0].pid not in {p.pid for p in gone.unowned}
        assert gone.cost.process_stats == 1  # the exited pid's stat alone
        assert answer(gone) == answer(ActiveSessionReader(world.home).observe().snapshot)
    finally:
        for fd in pidfds:
            os.close(fd)


def test_ownership_is_asked_only_about_what_changed(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a", execs=["exe_1", "exe_2"])
    world.exec_receipt("exe_1", process.pid)
    ownership = CountingOwnership(world.store_path)
    reader = trusting(world, ownership=ownership)
    reader.observe()
    reader.observe()
    calls = len(ownership.calls)
    quiet = reader.observe().snapshot
    assert pids(quiet) == {"ses_a": [("exec", process.pid)]}
    assert len(ownership.calls) == calls  # nothing changed: nothing asked

    world.feed.add([world.exec_receipt("exe_2", process.pid)])
    fed = reader.observe().snapshot
    assert ownership.calls[-1][:2] == (0, 1)  # only the new receipt's exec id
    assert pids(fed) == {"ses_a": [("exec", process.pid), ("exec", process.pid)]}

    world.own("ses_b", execs=["exe_1"])  # a commit: everything is asked again
    moved = reader.observe().snapshot
    assert ownership.calls[-1] == (0, 2, -1)  # and every process row
    assert pids(moved) == {"ses_a": [("exec", process.pid)], "ses_b": [("exec", process.pid)]}


def test_an_unchanged_answer_is_the_previous_one(world: World) -> None:
    process = world.pool.start()
    world.own("ses_a", execs=["exe_1"])
    world.exec_receipt("exe_1", process.pid)
    world.exec_receipt("exe_2", process.pid)
    reader = trusting(world)
    first = reader.observe().snapshot
    second = reader.observe().snapshot
    assert second.generation == first.generation
    assert second.sessions is first.sessions
    assert second.unowned is first.unowned

    broken = world.home / "runtime/exec-processes/broken.json"
    broken.write_text("{")
    world.feed.add([broken])
    third = reader.observe().snapshot
    assert third.generation == first.generation + 1
    assert any(gap.startswith(str(broken)) for gap in third.gaps)
    assert third.sessions is first.sessions  # only the gaps changed
    assert third.unowned is first.unowned


def test_incremental_answers_equal_a_walk_from_scratch(world: World) -> None:
    """Receipts come, change, move between sessions and go; processes exit; the store
    changes. After each step the trusting reader, told only the changed paths, gives
    the answer a new reader gives after walking the home."""
    rng = random.Random(20261129)
    processes = [world.pool.start() for _ in range(4)]
    live = list(processes)
    sessions = ["ses_a", "ses_b", "ses_c"]
    reader = trusting(world)
    paths: dict[str, Path] = {}
    for step in range(40):
        action = rng.choice(["write", "write", "write", "remove", "own", "kill"])
        key = f"{rng.choice(['exe', 'inp'])}_{rng.randrange(12)}"
        if action == "write" and live:
            pid = rng.choice(live).pid
            if key.startswith("exe"):
                path = world.exec_receipt(key, pid, command=f"step {step}")
            else:
                path = world.client_receipt(key, pid, client=f"c{rng.randrange(2)}")
            paths[str(path)] = path
            world.feed.add([path])
        elif action == "remove" and paths:
            path = paths.pop(rng.choice(sorted(paths)))
            path.unlink()
            world.feed.add([path])
        elif action == "own":
            owner = rng.choice(sessions)
            if key.startswith("exe"):
                world.own(owner, execs=[key], context_id=f"ctx_{step}")
            else:
                world.own(owner, inputs=[key])
        elif action == "kill" and len(live) > 1:
            world.pool.kill(live.pop(rng.randrange(len(live))))
        incremental = reader.observe().snapshot
        assert incremental.discovery == "ready", incremental.gaps
        fresh = ActiveSessionReader(world.home).observe().snapshot
        assert answer(incremental) == answer(fresh), f"step {step}: {action} {key}"
