"""The reader lists the sessions' descendants (docs/design.md §5, "Descendants"): real process
trees under real receipts, observed by a real reader; the looks between observations."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from helpers.processes import Sleepers, child_of, proc_state
from helpers.waits import wait_until
from helpers.world import World, pids

from capsule_client.wire import ActiveSessionsSnapshot, SessionProcess
from capsuled.processes.looks import DescendantLooks
from capsuled.processes.pid_marks import MARK_MARGIN_S
from capsuled.processes.sample import sample_processes, sample_with_table


class Shells:
    """``sh -c SCRIPT`` roots in process groups of their own, killed whole afterwards."""

    def __init__(self) -> None:
        self.roots: list[subprocess.Popen[bytes]] = []

    def start(self, script: str) -> subprocess.Popen[bytes]:
        root = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, process_group=0)
        self.roots.append(root)
        return root

    def close(self) -> None:
        for root in self.roots:
            try:
                os.killpg(root.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            assert root.stdin is not None
            root.stdin.close()
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


def processes_of(snapshot: ActiveSessionsSnapshot, session_id: str) -> dict[int, SessionProcess]:
    for session in snapshot.sessions:
        if session.session_id == session_id:
            return {process.pid: process for process in session.processes}
    return {}


def fork(shell: subprocess.Popen[bytes]) -> int:
    assert shell.stdin is not None
    shell.stdin.write(b"go\n")
    shell.stdin.flush()
    return child_of(shell.pid)


def test_the_sample_keeps_its_stat_lines_as_the_table(pool: Sleepers) -> None:
    process = pool.start()
    sample, table = sample_with_table()
    assert table is not None and table.last_pid is not None
    assert sample.keys() == table.stats.keys()
    assert table.stats[process.pid].ppid == os.getpid()
    assert table.stats[process.pid].session_id == os.getsid(0)
    assert process.pid in sample_processes()


def test_a_child_of_an_owned_receipt_process_is_its_sessions_descendant(
    world: World, shells: Shells
) -> None:
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.own("ses_a", execs=["exe_sh"])
    world.exec_receipt("exe_sh", shell.pid)
    observation = world.reader.observe()
    found = processes_of(observation.snapshot, "ses_a")
    assert found[shell.pid].kind == "exec"
    assert found[sleep].kind == "descendant"
    assert (found[sleep].parent_pid, found[sleep].root_pid) == (shell.pid, shell.pid)
    assert observation.snapshot.unowned == []
    # Its exit is watched like the session's other processes.
    assert observation.watched is not None and sleep in observation.watched

    generation = observation.snapshot.generation
    os.kill(shell.pid, signal.SIGKILL)
    shell.wait(timeout=5)
    snapshot = world.ready()
    assert pids(snapshot) == {"ses_a": [("descendant", sleep)]}  # still active, by its orphan
    assert snapshot.generation > generation
    os.kill(sleep, signal.SIGKILL)
    wait_until(lambda: proc_state(sleep) is None, message="the sleep reaped")
    assert world.ready().sessions == []


def test_an_owned_rows_children_are_descendants(world: World, shells: Shells) -> None:
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.own("ses_r", pids=[shell.pid])
    found = processes_of(world.ready(), "ses_r")
    assert found[shell.pid].kind == "process"
    assert found[sleep].kind == "descendant" and found[sleep].root_pid == shell.pid


def test_an_unowned_receipts_children_belong_to_no_session(world: World, shells: Shells) -> None:
    shell = shells.start("sleep 300 & wait")
    child_of(shell.pid)
    world.exec_receipt("exe_nobody", shell.pid)
    snapshot = world.ready()
    assert pids(snapshot) == {"unowned": [("exec", shell.pid)]}


def test_a_descendant_with_a_receipt_of_its_own_is_listed_once_as_that(
    world: World, shells: Shells
) -> None:
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.own("ses_a", execs=["exe_sh", "exe_sleep"])
    world.exec_receipt("exe_sh", shell.pid)
    world.exec_receipt("exe_sleep", sleep)
    assert sorted(pids(world.ready())["ses_a"]) == [("exec", shell.pid), ("exec", sleep)]


def test_a_look_between_observations_finds_a_fork_and_an_exit(world: World, shells: Shells) -> None:
    shell = shells.start("read go; sleep 300 & wait")
    world.own("ses_a", execs=["exe_sh"])
    world.exec_receipt("exe_sh", shell.pid)
    before = world.ready()
    lineage = world.reader.lineage
    assert lineage.active
    assert not lineage.look()  # nothing forked
    sleep = fork(shell)
    assert wait_until(lineage.look, message="the look to see the fork")
    snapshot = world.ready()
    assert processes_of(snapshot, "ses_a")[sleep].kind == "descendant"
    assert snapshot.generation > before.generation
    assert not lineage.look()  # the observation took it in
    os.kill(sleep, signal.SIGKILL)
    assert wait_until(lineage.look, message="the look to see the exit")


def test_a_root_older_than_the_last_look_owes_a_table_that_the_next_look_takes(
    world: World, pool: Sleepers, shells: Shells
) -> None:
    """An observation with a partial sample has no table: a new root started before
    the tracker's last look may have started processes no probe sees (docs/design.md §5)."""
    world.reader.trust_watcher = True  # observations that do not walk sample partially
    other = pool.start()
    world.own("ses_b", execs=["exe_other"])
    world.exec_receipt("exe_other", other.pid)
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.exec_receipt("exe_sh", shell.pid)  # unowned: no root yet
    assert pids(world.ready())["unowned"] == [("exec", shell.pid)]
    lineage = world.reader.lineage
    assert not lineage.owes_table

    world.own("ses_a", execs=["exe_sh"])  # the shell becomes a root, long after it forked
    owned = world.ready()
    assert processes_of(owned, "ses_a")[shell.pid].kind == "exec"
    assert owned.cost.process_stats <= 3  # the candidates' pids, no table
    assert lineage.owes_table
    assert lineage.look()  # the look takes the table and finds the older child
    assert not lineage.owes_table
    found = processes_of(world.ready(), "ses_a")
    assert found[sleep].kind == "descendant" and found[sleep].root_pid == shell.pid


def test_a_new_root_started_after_a_kept_look_is_probed_from_it_not_owed_a_table(
    world: World, pool: Sleepers, shells: Shells
) -> None:
    """A root that became one after it forked, but started over a second after a look
    the tracker keeps: its children have later pids, and the same observation finds
    them by probing from that look's counter (docs/design.md §5)."""
    world.reader.trust_watcher = True  # observations that do not walk sample partially
    other = pool.start()
    world.own("ses_b", execs=["exe_other"])
    world.exec_receipt("exe_other", other.pid)
    world.ready()  # a look: its mark is kept
    marked = time.clock_gettime(time.CLOCK_BOOTTIME)
    wait_until(
        lambda: time.clock_gettime(time.CLOCK_BOOTTIME) > marked + MARK_MARGIN_S + 0.05,
        message="the margin after the kept look",
    )
    shell = shells.start("sleep 300 & wait")
    sleep = child_of(shell.pid)
    world.feed.add([world.exec_receipt("exe_sh", shell.pid)])  # unowned: no root yet
    assert pids(world.ready())["unowned"] == [("exec", shell.pid)]  # a look after the fork
    lineage = world.reader.lineage

    world.own("ses_a", execs=["exe_sh"])  # the shell becomes a root, after it forked
    world.feed.store_changed()
    found = processes_of(world.ready(), "ses_a")
    assert found[sleep].kind == "descendant" and found[sleep].root_pid == shell.pid
    assert not lineage.owes_table
    assert not lineage.look()  # nothing left for a look to find


def test_an_owed_table_makes_the_look_timer_look_at_once() -> None:
    owed = False
    looked = threading.Event()

    def look() -> bool:
        looked.set()
        return False

    async def main() -> None:
        nonlocal owed
        looks = DescendantLooks(
            look=look,
            active=lambda: True,
            wake=lambda: None,
            owed=lambda: owed,
            counter=lambda: 7,  # nothing forked: only an owed look runs
            interval_s=3600.0,
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(looks.run)
            await anyio.wait_all_tasks_blocked()
            assert not looked.is_set()
            owed = True
            looks.observed()
            assert await anyio.to_thread.run_sync(looked.wait, 5)
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_no_session_process_no_looks(world: World, pool: Sleepers) -> None:
    world.exec_receipt("exe_nobody", pool.start().pid)  # an unowned receipt is no root
    world.ready()
    assert not world.reader.lineage.active
    assert not world.reader.lineage.look()


def test_the_look_timer_sleeps_while_inactive_and_wakes_discovery_on_a_change() -> None:
    active = False
    looked: list[bool] = []

    def look() -> bool:
        looked.append(True)
        return True

    async def main() -> None:
        woken = anyio.Event()
        looks = DescendantLooks(look=look, active=lambda: active, wake=woken.set, interval_s=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(looks.run)
            looks.observed()  # nothing to look at: the timer stays asleep
            with anyio.move_on_after(0.2):
                await woken.wait()
            assert not woken.is_set() and looks.looks == 0
            nonlocal active
            active = True
            looks.observed()
            with anyio.fail_after(5):
                await woken.wait()
            assert looks.looks >= 1 and looks.changes >= 1
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert looked


def test_no_look_runs_while_the_pid_counter_has_not_moved() -> None:
    counter = 7
    looked = 0
    ticks = 0
    twenty_ticks = threading.Event()
    looks_seen = {n: threading.Event() for n in (1, 2, 3)}

    def look() -> bool:  # in a worker thread
        nonlocal looked
        looked += 1
        looks_seen[looked].set()
        return False

    def read_counter() -> int:
        nonlocal ticks
        ticks += 1
        if ticks >= 20:
            twenty_ticks.set()
        return counter

    async def main() -> None:
        nonlocal counter
        looks = DescendantLooks(
            look=look, active=lambda: True, wake=lambda: None, counter=read_counter, interval_s=0.01
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(looks.run)
            # Twenty ticks with the same counter: one look.
            await anyio.to_thread.run_sync(twenty_ticks.wait, 5)
            assert looked == 1 and looks.looks == 1
            counter = 8  # a process was started somewhere: the next tick looks
            assert await anyio.to_thread.run_sync(looks_seen[2].wait, 5)
            looks.observed()  # new roots: the next tick looks whatever the counter says
            assert await anyio.to_thread.run_sync(looks_seen[3].wait, 5)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert looked == 3
