"""A session's state (docs/design.md §13): running while one of its own processes lives,
ended when only what it left behind remains, and when the daemon saw it end.

Real process trees under real receipts and store rows, observed by a real reader;
and the projection given its inputs directly, for a session it never saw run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from helpers.processes import Sleepers, child_of
from helpers.world import World

from capsule_client.wire import Session
from capsuled.processes.descendants import Descendant
from capsuled.processes.identity import Start
from capsuled.reader.candidates import Candidates
from capsuled.reader.errors import Errors
from capsuled.reader.ownership import Owners
from capsuled.reader.projection import Inputs, Projection
from capsuled.reader.store import ProcessRow


class Shells:
    """``sh -c SCRIPT`` roots in process groups of their own, killed whole afterwards."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []

    def start(self, script: str) -> subprocess.Popen[bytes]:
        root = subprocess.Popen(["sh", "-c", script], process_group=0)
        self.roots.append(root)
        return root

    def close(self) -> None:
        for root in self.roots:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            root.wait(timeout=5)


@pytest.fixture
def shells() -> Iterator[Shells]:
    pool = Shells()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def world(tmp_path: Path, pool: Sleepers) -> World:
    return World(tmp_path / "home", pool)


def session(world: World, session_id: str) -> Session:
    for found in world.ready().sessions:
        if found.session_id == session_id:
            return found
    raise AssertionError(f"{session_id} is not listed")


def test_a_session_is_running_while_its_receipts_process_lives_and_ended_after(
    world: World, shells: Shells
) -> None:
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.own("ses_a", execs=["exe_sh"])
    world.exec_receipt("exe_sh", shell.pid)
    running = session(world, "ses_a")
    assert running.state == "running"
    assert isinstance(running.ended_at, msgspec.UnsetType)

    before = time.time()
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait(timeout=5)
    ended = session(world, "ses_a")
    after = time.time()
    assert ended.state == "ended"
    assert [(p.kind, p.pid) for p in ended.processes] == [("descendant", sleep)]
    assert isinstance(ended.ended_at, float) and before <= ended.ended_at <= after

    # What the daemon saw stays as it was, and the answer does not move.
    generation = world.ready().generation
    again = session(world, "ses_a")
    assert again.ended_at == ended.ended_at
    assert world.ready().generation == generation


def test_an_owned_row_keeps_a_session_running_and_a_new_one_runs_it_again(
    world: World, shells: Shells, pool: Sleepers
) -> None:
    shell = shells.start("sleep 300 & wait")
    child_of(shell.pid)
    world.own("ses_r", pids=[shell.pid])
    assert session(world, "ses_r").state == "running"
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait(timeout=5)
    first = session(world, "ses_r")
    assert first.state == "ended" and isinstance(first.ended_at, float)

    # Resumed: a new process of its own (a launcher registered again).
    resumed = pool.start()
    world.own("ses_r", pids=[resumed.pid])
    again = session(world, "ses_r")
    assert again.state == "running"
    assert isinstance(again.ended_at, msgspec.UnsetType)

    pool.kill(resumed)
    second = session(world, "ses_r")
    assert second.state == "ended"
    assert isinstance(second.ended_at, float) and second.ended_at > first.ended_at


def test_the_state_goes_on_the_wire_always_and_ended_at_only_when_ended(
    world: World, shells: Shells
) -> None:
    shell = shells.start("sleep 300 & wait")
    child_of(shell.pid)
    world.own("ses_a", execs=["exe_sh"])
    world.exec_receipt("exe_sh", shell.pid)
    encoded = msgspec.json.decode(msgspec.json.encode(session(world, "ses_a")))
    assert encoded["state"] == "running" and "ended_at" not in encoded
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait(timeout=5)
    encoded = msgspec.json.decode(msgspec.json.encode(session(world, "ses_a")))
    assert encoded["state"] == "ended" and isinstance(encoded["ended_at"], float)


def _inputs(owners: Owners, descendants: dict[tuple[int, int], Descendant]) -> Inputs:
    return Inputs(
        candidates=Candidates(),
        owners=owners,
        sample={1000: Start(1_700_000_000.0)},
        servers=[],
        errors=Errors(),
        home_gap=None,
        descendants=descendants,
    )


def test_a_session_first_seen_ended_has_no_end_time() -> None:
    """Only what it left behind, and never seen running here: when it ended is unknown."""
    left = {(2000, 1_700_000_001): Descendant(2000, 1_700_000_001, 1000, 1000, "ses_x")}
    answer = Projection().project(_inputs(Owners(), left))
    (found,) = answer.sessions
    assert (found.state, found.ended_at) == ("ended", None)


def test_a_session_seen_running_then_ended_has_its_end_time_kept_across_a_forget() -> None:
    projection = Projection()
    owners = Owners()
    owners.rows = {1000: [ProcessRow(1_700_000_000, "ses_x")]}
    left = {(2000, 1_700_000_001): Descendant(2000, 1_700_000_001, 1000, 1000, "ses_x")}
    assert projection.project(_inputs(owners, left)).sessions[0].state == "running"
    owners.rows = {}
    ended = projection.project(_inputs(owners, left)).sessions[0]
    assert ended.state == "ended" and isinstance(ended.ended_at, float)
    projection.forget()  # a failed observation: the lists are built again, not what was seen
    assert projection.project(_inputs(owners, left)).sessions[0].ended_at == ended.ended_at
