"""A clock step changes no process's identity in the daemon (docs/design.md §14).

A clock step moves the boot time the kernel reports, and with it every wall-clock
start computed after it; the start ticks stay. The daemon reads the boot time
only through ``capsuled.processes.identity.boot_time_s``: these tests move it
there (``clock_step``), never the machine's clock, and show that the exit
watch, the descendants, terminate's last check and the argv cache keep naming
the same processes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest
from helpers.processes import DEADLINE_S, Processes
from helpers.waits import wait_until

from capsule_client.kit.proc import boot_id, process_start, read_stat, read_stat_line
from capsuled.processes import identity
from capsuled.processes.argv import ArgvCache, argv_of
from capsuled.processes.exits import ExitWatch, pidfds_supported
from capsuled.processes.identity import Clock, Start, claim_matches
from capsuled.processes.sample import PartialSample, sample_processes
from capsuled.processes.terminate import Target, terminate
from capsuled.reader.lineage import Lineage

pytestmark = pytest.mark.skipif(not pidfds_supported(), reason="no pidfd on this system")

#: A step of the clock, seconds: far past every tolerance (3 s, 5 s, 6 s).
STEP_S = 90
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def clock_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``clock_step(s)``: from now on the daemon's boot time reads ``s`` seconds later
    than the kernel's, as it would after the wall clock was stepped by ``s``."""
    real = identity.boot_time_s

    def step(seconds: int) -> None:
        monkeypatch.setattr(identity, "boot_time_s", lambda: real() + seconds)

    return step


def ticks(pid: int) -> int:
    return read_stat(pid).start_ticks


def test_a_claim_is_matched_exactly_where_both_sides_have_the_identity() -> None:
    this_boot = boot_id()
    assert this_boot is not None
    start = Start(1000.0, 500)
    assert claim_matches(start, 1000 + STEP_S, 3, this_boot, 500)  # off by a step: the same
    assert not claim_matches(start, 1000, 3, this_boot, 501)  # other ticks: another process
    assert not claim_matches(start, 1000, 3, OTHER_BOOT, 500)  # another boot: never live
    assert claim_matches(start, 1003, 3) and not claim_matches(start, 1003.5, 3)  # no identity
    assert claim_matches(Start(1000.0), 1002, 3, this_boot, 500)  # no ticks sampled: tolerance


def test_a_step_moves_the_sample_but_not_its_ticks(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    """Every sample converts the ticks with the boot time read now, a held process's
    too (the exit watch gave it with an older sample's start time)."""
    process, held = procs.sleep(), procs.sleep()
    before = sample_processes()
    clock_step(STEP_S)
    after = sample_processes()
    partial = PartialSample({held.pid: before[held.pid]})
    for pid in (process.pid, held.pid):
        assert after[pid].ticks == partial[pid].ticks == before[pid].ticks == ticks(pid)
        assert after[pid].s == partial[pid].s == pytest.approx(before[pid].s + STEP_S)
    assert partial.reads == 1  # the held one is not read


@pytest.fixture
def pidfd_opens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids ``os.pidfd_open`` is called with from now on (the syscall still runs)."""
    opened: list[int] = []
    real = os.pidfd_open

    def counted(pid: int, flags: int = 0) -> int:
        opened.append(pid)
        return real(pid, flags)

    monkeypatch.setattr(os, "pidfd_open", counted)
    return opened


def run_watch(steps: Callable[[ExitWatch], None]) -> list[None]:
    """Run an exit watch through ``steps``; the exits it reported."""
    exits: list[None] = []

    async def main() -> None:
        watch = ExitWatch(lambda: exits.append(None))
        async with anyio.create_task_group() as tg:
            await tg.start(watch.serve)
            steps(watch)
            await anyio.lowlevel.checkpoint()  # a waiter that was woken would report now
            tg.cancel_scope.cancel()

    anyio.run(main)
    return exits


def test_a_held_process_keeps_its_pidfd_across_a_step(
    procs: Processes, clock_step: Callable[[int], None], pidfd_opens: list[int]
) -> None:
    process = procs.sleep()

    def steps(watch: ExitWatch) -> None:
        for seconds in (0, STEP_S, -STEP_S):
            clock_step(seconds)
            watch.track({process.pid: sample_processes()[process.pid]})
            assert watch.held == 1

    assert run_watch(steps) == []
    assert pidfd_opens.count(process.pid) == 1  # opened once: a step re-opened nothing


def test_a_step_between_the_sample_and_the_pidfds_check_is_no_exit(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    process = procs.sleep()

    def steps(watch: ExitWatch) -> None:
        sampled = sample_processes()[process.pid]
        clock_step(STEP_S)  # the re-check after pidfd_open reads the stepped boot time
        watch.track({process.pid: sampled})
        assert watch.held == 1

    assert run_watch(steps) == []


def test_a_reused_pid_is_still_an_exit_whatever_the_times_say(procs: Processes) -> None:
    """The ticks decide: a sample naming this pid with other ticks names another process,
    even when its start time is the same to the second."""
    process = procs.sleep()

    def steps(watch: ExitWatch) -> None:
        sampled = sample_processes()[process.pid]
        assert sampled.ticks is not None
        watch.track({process.pid: Start(sampled.s, sampled.ticks - 7)})
        assert watch.held == 0

    assert run_watch(steps) == [None]


def shell_with_child(procs: Processes) -> tuple[subprocess.Popen[bytes], int]:
    shell = procs.start(["sh", "-c", "sleep 300 & wait"])

    def child() -> int | None:
        try:
            with open(f"/proc/{shell.pid}/task/{shell.pid}/children") as file:
                found = file.read().split()
        except OSError:
            return None
        return int(found[0]) if found else None

    pid = wait_until(child, message="the shell's child")
    procs.adopt(pid)
    return shell, pid


def test_descendants_keep_their_keys_and_their_root_across_a_step(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    """A root listed with a start time off by a step (a row written before it) keeps its
    descendants, and each descendant keeps the start time it was first listed with."""
    shell, child = shell_with_child(procs)
    start = process_start(shell.pid)
    row_started_at = round(start.started_at_s) - STEP_S  # the row was written before a step
    roots = {(shell.pid, row_started_at): "ses_a"}
    lineage = Lineage()
    try:
        found = dict(lineage.observe(roots, None, sample_processes()))
        assert [(d.pid, d.root_pid, d.session_id) for d in found.values()] == [
            (child, shell.pid, "ses_a")
        ]
        for seconds in (STEP_S, -STEP_S, 0):
            clock_step(seconds)
            assert not lineage.look()  # no descendant appeared or left
            assert dict(lineage.observe(roots, None, sample_processes())) == found
    finally:
        lineage.close()


def test_terminate_signals_the_process_its_ticks_name(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    """Terminate's last check before a signal is the ticks: a process listed with a start
    time a step away is signalled; one whose ticks differ is gone, and untouched."""
    listed, other = procs.sleep(), procs.sleep()
    clock_step(STEP_S)
    now = sample_processes()
    targets = [
        Target(
            listed.pid, round(now[listed.pid].s) - STEP_S, "process", start_ticks=ticks(listed.pid)
        ),
        Target(
            other.pid,
            round(now[other.pid].s),
            "process",
            now[other.pid].s,
            start_ticks=ticks(other.pid) + 1,
        ),
    ]

    async def main() -> dict[int, str]:
        report = await terminate("ses_a", targets, grace_s=DEADLINE_S)
        return {p.pid: p.outcome for p in report.processes}

    assert anyio.run(main) == {listed.pid: "exited", other.pid: "gone"}
    assert other.poll() is None  # never signalled


def running(pid: int, comm: str) -> None:
    """Wait until ``pid`` runs the program named ``comm`` and its ``exec`` is done: the
    kernel sets the new name before it lays out the new argv."""

    def done() -> bool:
        if not read_stat_line(pid).startswith(f"{pid} ({comm})".encode()):
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return bool(file.read())

    wait_until(done, message=f"{pid} running {comm}")


def test_the_argv_of_a_process_listed_a_step_away_is_read_by_its_ticks(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    process = procs.sleep()
    running(process.pid, "sleep")
    listed_at = round(Clock().seconds(ticks(process.pid))) - STEP_S
    assert argv_of(process.pid, listed_at) is None  # by the time alone: not the process listed
    assert argv_of(process.pid, listed_at, ticks(process.pid)) == ["sleep", "300"]
    assert argv_of(process.pid, listed_at + STEP_S, ticks(process.pid) + 1) is None  # reused


def test_the_argv_cache_follows_an_exec_after_a_step(
    procs: Processes, clock_step: Callable[[int], None]
) -> None:
    """A process kept in the cache that execs after a step is read again as itself."""
    script = "read line; exec sleep 301"
    process = procs.start(["sh", "-c", script], stdin=subprocess.PIPE)
    running(process.pid, "sh")
    cache = ArgvCache()
    key = (process.pid, round(Clock().seconds(ticks(process.pid))))
    assert cache.read([key]) == {key: ["sh", "-c", script]}
    clock_step(STEP_S)
    assert process.stdin is not None
    process.stdin.write(b"go\n")
    process.stdin.close()
    running(process.pid, "sleep")
    assert cache.read([key], fresh=True) == {key: ["sleep", "301"]}
