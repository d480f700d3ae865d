"""Session discovery in-process: single flight, cached answers, retries, polls.

The rules are docs/design.md §5 and §7.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec
import pytest
from helpers.processes import DEADLINE_S, Sleepers
from helpers.world import OwnershipMovingAlways, OwnershipMovingOnce, World, make_home, pids

from capsule_client.wire import ActiveSessionsSnapshot, SnapshotParams
from capsuled.discovery.discovery import NO_WATCHER_NOTE, Discovery
from capsuled.errors import DiscoveryUnavailable, ShuttingDown
from capsuled.reader import ActiveSessionReader
from capsuled.reader.store import OwnershipReader
from capsuled.service.supervisor import build_discovery

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(tmp_path: Path, pool: Sleepers) -> World:
    return World(tmp_path / "home", pool)


@asynccontextmanager
async def running(discovery: Discovery) -> AsyncIterator[Discovery]:
    async with anyio.create_task_group() as tg:
        await tg.start(discovery.serve)
        await discovery.first_observation.wait()
        yield discovery
        tg.cancel_scope.cancel()


@pytest.fixture
async def discovery(world: World) -> AsyncIterator[Discovery]:
    # A long sample interval: the sampler observes once, then only requests do.
    async with running(build_discovery(world.home, sample_interval_s=30)) as started:
        yield started


async def snapshot(discovery: Discovery, **params: object) -> ActiveSessionsSnapshot:
    return await discovery.snapshot(SnapshotParams(**params))  # type: ignore[arg-type]


async def test_concurrent_requests_share_one_observation(discovery: Discovery) -> None:
    before = discovery.totals.observations
    results: list[ActiveSessionsSnapshot] = []

    async def ask() -> None:
        results.append(await snapshot(discovery, max_age_ms=0))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(ask)
    assert discovery.totals.observations == before + 1
    assert len({id(result.cost) for result in results}) == 1  # one observation's answer


async def test_a_young_answer_is_reused_and_max_age_zero_observes(discovery: Discovery) -> None:
    first = await snapshot(discovery, task="a")
    again = await snapshot(discovery, task="b")
    assert again.observed_at == first.observed_at
    assert (first.task, again.task) == ("a", "b")
    forced = await snapshot(discovery, max_age_ms=0)
    assert forced.observed_at > first.observed_at


async def test_without_a_watcher_every_observation_walks(
    discovery: Discovery, world: World
) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)  # never reported through the feed
    answer = await snapshot(discovery, max_age_ms=0)
    assert pids(answer) == {"unowned": [("exec", process.pid)]}
    assert answer.cost.rescans == 1
    assert discovery.notes == [NO_WATCHER_NOTE]


async def test_with_a_watcher_pending_changes_bypass_the_cache(world: World) -> None:
    watched = build_discovery(world.home, sample_interval_s=30, watcher_mode=lambda: "native")
    async with running(watched) as discovery:
        assert discovery.notes == []
        process = world.pool.start()
        discovery.changes.add([world.exec_receipt("exe_1", process.pid)])
        answer = await snapshot(discovery, max_age_ms=60_000)
        assert pids(answer) == {"unowned": [("exec", process.pid)]}
        assert answer.cost.rescans == 0
        assert answer.cost.dirty_paths == 1
        # nothing pending: the young answer is reused
        assert (await snapshot(discovery, max_age_ms=60_000)).observed_at == answer.observed_at


async def test_scanning_is_retried_until_ready(discovery: Discovery, world: World) -> None:
    process = world.pool.start()
    world.own("ses_a")
    world.exec_receipt("exe_1", process.pid)
    discovery.reader.current = ActiveSessionReader(
        world.home, discovery.changes, ownership=OwnershipMovingOnce(world)
    )
    before = discovery.totals.observations
    answer = await snapshot(discovery, max_age_ms=0)
    assert answer.discovery == "ready"
    assert pids(answer) == {"ses_late": [("exec", process.pid)]}
    assert discovery.totals.observations == before + 2


async def test_scanning_past_the_deadline_is_answered_as_is(
    discovery: Discovery, world: World
) -> None:
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    discovery.reader.current = ActiveSessionReader(
        world.home, discovery.changes, ownership=OwnershipMovingAlways(world)
    )
    answer = await snapshot(discovery, max_age_ms=0, timeout_ms=300)
    assert answer.discovery == "scanning"
    assert answer.sessions == []
    assert discovery.totals.observations >= 2  # retried until the deadline


async def test_max_age_zero_with_no_time_to_observe_is_unavailable(discovery: Discovery) -> None:
    with pytest.raises(DiscoveryUnavailable, match=r"did not finish within timeout_ms \(0 ms\)"):
        await snapshot(discovery, max_age_ms=0, timeout_ms=0)


async def test_a_replaced_home_gets_a_fresh_reader(
    discovery: Discovery, world: World, tmp_path: Path
) -> None:
    process = world.pool.start()
    first = await snapshot(discovery, max_age_ms=0)
    world.home.rename(tmp_path / "old")
    make_home(world.home)
    world.exec_receipt("exe_1", process.pid)
    answer = await snapshot(discovery, max_age_ms=0)
    assert answer.discovery == "ready"
    assert pids(answer) == {"unowned": [("exec", process.pid)]}
    assert discovery.totals.readers_restarted == 1
    assert answer.generation == first.generation + 2  # unavailable, then this


async def test_since_answers_at_once_when_the_generation_differs(discovery: Discovery) -> None:
    current = await snapshot(discovery)
    started = time.monotonic()
    answer = await snapshot(discovery, since=current.generation + 5, timeout_ms=5000)
    assert time.monotonic() - started < 1
    assert answer.generation == current.generation


async def test_since_waits_for_a_change(world: World) -> None:
    async with running(build_discovery(world.home, sample_interval_s=0.05)) as discovery:
        current = await snapshot(discovery)
        process = world.pool.start()
        answer: list[ActiveSessionsSnapshot] = []

        async def long_poll() -> None:
            answer.append(await snapshot(discovery, since=current.generation, timeout_ms=5000))

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_poll)
            deadline = time.monotonic() + 5  # the poll waits before the receipt is written
            while not discovery.long_polls:
                assert time.monotonic() < deadline, "the long poll never waited"
                await anyio.sleep(0.01)
            world.exec_receipt("exe_1", process.pid)
        assert answer[0].generation == current.generation + 1
        assert pids(answer[0]) == {"unowned": [("exec", process.pid)]}


async def test_since_times_out_with_the_same_generation(discovery: Discovery) -> None:
    current = await snapshot(discovery)
    started = time.monotonic()
    answer = await snapshot(discovery, since=current.generation, timeout_ms=200)
    assert 0.19 <= time.monotonic() - started < 2
    assert answer.generation == current.generation


async def test_ending_long_polls_answers_them_shutting_down(discovery: Discovery) -> None:
    current = await snapshot(discovery)
    ended: list[BaseException] = []

    async def poll() -> None:
        try:
            await snapshot(discovery, since=current.generation, timeout_ms=60_000)
        except ShuttingDown as exc:
            ended.append(exc)

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(poll)
        await anyio.wait_all_tasks_blocked()  # the poll waits for a change
        # Else end_long_polls() would come first, and the poll be refused as it
        # starts: the assertions below would hold as well.
        assert discovery.long_polls == 1
        discovery.end_long_polls()
    assert time.monotonic() - started < 2
    assert [str(exc) for exc in ended] == ["shutting down: the long poll ends without a change"]
    with pytest.raises(ShuttingDown):  # and so does one that starts later
        await snapshot(discovery, since=current.generation, timeout_ms=60_000)
    # A poll whose generation is already gone is answered as before.
    answer = await snapshot(discovery, since=current.generation + 1)
    assert answer.generation == current.generation


async def test_a_stopped_discovery_refuses_to_observe(discovery: Discovery) -> None:
    discovery.stop()
    with pytest.raises(ShuttingDown):
        await snapshot(discovery, max_age_ms=0)


async def test_snapshot_json_is_the_snapshot_encoded_once(tmp_path: Path, pool: Sleepers) -> None:
    # A home whose name spells the keys the encoder splices at must not confuse it.
    world = World(tmp_path / 'h"sessions":0,"unowned":0', pool)
    process = world.pool.start()
    world.own("ses_a", execs=["exe_1"], context_id="ctx_a")
    world.exec_receipt("exe_1", process.pid)
    world.exec_receipt("exe_2", process.pid)
    async with running(build_discovery(world.home, sample_interval_s=30)) as discovery:
        parts = await discovery.snapshot_json(SnapshotParams(task="t", max_age_ms=0))
        decoded = msgspec.json.decode(b"".join(parts), type=ActiveSessionsSnapshot)
        assert decoded.home == str(world.home)
        assert decoded.task == "t"
        assert pids(decoded) == {
            "ses_a": [("exec", process.pid)],
            "unowned": [("exec", process.pid)],
        }
        assert decoded == msgspec.structs.replace(discovery.latest, task="t")

        assert await discovery.snapshot_json(SnapshotParams(task="t")) is parts  # kept
        untasked = await discovery.snapshot_json(SnapshotParams())
        assert msgspec.json.decode(b"".join(untasked), type=ActiveSessionsSnapshot) == (
            msgspec.structs.replace(decoded, task=None)
        )

        newer = await discovery.snapshot_json(SnapshotParams(max_age_ms=0))
        renewed = msgspec.json.decode(b"".join(newer), type=ActiveSessionsSnapshot)
        assert renewed == discovery.latest
        assert renewed.sessions == decoded.sessions
        assert renewed.generation == decoded.generation


async def test_a_new_answer_with_the_same_lists_shares_their_encoding(world: World) -> None:
    """While a watcher runs, an observation that found nothing new keeps the lists
    (the reader hands back the same objects): only the rest is encoded again."""
    process = world.pool.start()
    world.exec_receipt("exe_1", process.pid)
    discovery = build_discovery(world.home, sample_interval_s=30, watcher_mode=lambda: "native")
    async with running(discovery):
        first = await discovery.snapshot_json(SnapshotParams(max_age_ms=0))
        again = await discovery.snapshot_json(SnapshotParams(max_age_ms=0))
    assert again is not first  # a new observation: a new observed_at and cost
    assert again[1] is first[1] and again[3] is first[3]  # sessions, unowned
    decoded = msgspec.json.decode(b"".join(again), type=ActiveSessionsSnapshot)
    assert pids(decoded) == {"unowned": [("exec", process.pid)]}


async def test_a_plain_request_right_after_a_wake_is_answered_by_an_observation_begun_after_it(
    world: World,
) -> None:
    # Exits left to sampling: without the wake, the default max_age would
    # accept the latest answer for a whole sample interval.
    watched = build_discovery(
        world.home, sample_interval_s=30, watcher_mode=lambda: "native", exit_events=False
    )
    async with running(watched) as discovery:
        process = world.pool.start()
        discovery.changes.add([world.exec_receipt("exe_1", process.pid)])
        assert pids(await snapshot(discovery)) == {"unowned": [("exec", process.pid)]}
        world.pool.kill(process)
        discovery.wake()  # as an exit event does; the request follows with no await between
        assert pids(await snapshot(discovery)) == {}


class LockAsked(OwnershipReader):
    """The real store reader; :attr:`asked_again` is set once it found a writer's
    lock held three times."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.held_seen = 0
        self.asked_again = threading.Event()

    def writing(self) -> bool:
        held = super().writing()
        self.held_seen += held
        if self.held_seen >= 3:
            self.asked_again.set()
        return held


async def test_a_store_write_heard_inside_its_transaction_costs_one_observation_after_it(
    world: World,
) -> None:
    """The watch hears a commit's WAL write before the commit can be read: discovery
    observes once the writer's lock is free, not at once and again then."""
    process = world.pool.start()
    world.own("ses_a")
    world.exec_receipt("exe_1", process.pid)
    discovery = build_discovery(world.home, sample_interval_s=30, watcher_mode=lambda: "native")
    ownership = LockAsked(world.store_path)
    discovery.reader.current = ActiveSessionReader(
        world.home, discovery.changes, ownership=ownership
    )
    writer = sqlite3.connect(world.store_path, timeout=5, isolation_level=None)
    try:
        async with running(discovery):
            assert pids(await snapshot(discovery)) == {"unowned": [("exec", process.pid)]}
            before = discovery.totals.observations
            writer.execute("BEGIN IMMEDIATE")  # the write lock, held until the commit
            writer.execute(
                "INSERT INTO session_execs (exec_id, session_id) VALUES (?, ?)",
                ("exe_1", "ses_a"),
            )
            discovery.changes.store_changed()  # as the watch reports the WAL write
            # The lock asked again and again while the transaction stays open.
            assert await anyio.to_thread.run_sync(ownership.asked_again.wait, DEADLINE_S)
            assert discovery.totals.observations == before  # nothing readable changed yet
            writer.execute("COMMIT")
            with anyio.fail_after(DEADLINE_S):
                while pids(answer := await snapshot(discovery)) != {
                    "ses_a": [("exec", process.pid)]
                }:
                    await discovery.next_answer()
            assert answer.discovery == "ready"
            assert discovery.totals.observations == before + 1
    finally:
        writer.close()
