"""Liveness by exact identity, and a reader a clock step cannot move (docs/design.md §3, §14).

What a clock step leaves behind is made here as it would be: receipts and
rows whose ``started_at`` is off by a step from what the kernel's boot time
gives today, carrying the boot id and start ticks of their process. The step
itself, while the reader runs, moves the boot time the daemon reads
(``capsuled.processes.identity.boot_time_s``), never the machine's clock.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.processes import sleepers
from helpers.waits import wait_until
from helpers.world import World

from capsule_client.kit.proc import ProcessStart, process_start
from capsule_client.kit.receipts import write_exec_receipt, write_provider_client_receipt
from capsule_client.wire import ActiveSessionsSnapshot
from capsuled.processes import identity

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the exact identity is Linux's"
)

STEP_S = 90
OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with sleepers() as pool:
        yield World(tmp_path / "home", pool)


@pytest.fixture
def clock_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """``clock_step(s)``: the daemon's boot time reads ``s`` seconds later from now on."""
    real = identity.boot_time_s

    def step(seconds: int) -> None:
        monkeypatch.setattr(identity, "boot_time_s", lambda: real() + seconds)

    return step


def recorded(pid: int, seconds: float = 0, boot_id: str | None = None) -> ProcessStart:
    """The start of ``pid`` as a writer recorded it ``seconds`` of clock step ago, in
    ``boot_id`` (default: this boot)."""
    start = process_start(pid)
    return ProcessStart(start.started_at_s + seconds, boot_id or start.boot_id, start.start_ticks)


def claim(world: World, session_id: str, starts: dict[str, tuple[int, ProcessStart]]) -> None:
    """A provider client (``client``), an exec (``exec``) and a row (``row``) of
    ``session_id``, each recorded with the start given."""
    with world.store() as store:
        store.register_session(session_id)
        for kind, (pid, start) in starts.items():
            if kind == "client":
                write_provider_client_receipt(world.home, "r", "inp_a", "c", pid, start=start)
                store.register_input("inp_a", session_id)
            elif kind == "exec":
                write_exec_receipt(world.home, "exe_a", pid, start=start)
                store.register_exec("exe_a", session_id)
            else:
                store.register_process(pid, session_id, start=start)


def listed(snapshot: ActiveSessionsSnapshot) -> set[tuple[str, str, int, int]]:
    """(session or "unowned", kind, pid, started_at) of every process listed."""
    found = {
        (s.session_id, p.kind, p.pid, p.started_at) for s in snapshot.sessions for p in s.processes
    }
    return found | {("unowned", p.kind, p.pid, p.started_at) for p in snapshot.unowned}


@pytest.mark.parametrize("seconds", [-STEP_S, STEP_S])
def test_claims_off_by_a_step_with_their_processs_identity_are_live(
    world: World, seconds: int
) -> None:
    client, tool, shell = (world.pool.start() for _ in range(3))
    starts = {
        "client": (client.pid, recorded(client.pid, seconds)),
        "exec": (tool.pid, recorded(tool.pid, seconds)),
        "row": (shell.pid, recorded(shell.pid, seconds)),
    }
    claim(world, "ses_a", starts)
    kinds = {"client": "provider_client", "exec": "exec", "row": "process"}
    assert listed(world.ready()) == {
        ("ses_a", kinds[kind], pid, round(start.started_at_s))
        for kind, (pid, start) in starts.items()
    }


def test_the_right_ticks_under_another_boot_id_are_not_live(world: World) -> None:
    """A reboot can hand out the pid, and ticks, again: another boot is another process,
    whatever the times say (these are today's to the second)."""
    client, tool, shell = (world.pool.start() for _ in range(3))
    claim(
        world,
        "ses_a",
        {
            "client": (client.pid, recorded(client.pid, boot_id=OTHER_BOOT)),
            "exec": (tool.pid, recorded(tool.pid, boot_id=OTHER_BOOT)),
            "row": (shell.pid, recorded(shell.pid, boot_id=OTHER_BOOT)),
        },
    )
    snapshot = world.ready()
    assert listed(snapshot) == set()


def test_claims_without_identity_are_judged_by_their_tolerance(world: World) -> None:
    near, far = world.pool.start(), world.pool.start()
    with world.store() as store:
        store.register_session("ses_a")
        for pid, seconds in ((near.pid, 2), (far.pid, STEP_S)):
            store.register_process(
                pid, "ses_a", started_at_s=process_start(pid).started_at_s + seconds
            )
    assert {(kind, pid) for _, kind, pid, _ in listed(world.ready())} == {("process", near.pid)}


def shell_with_child(world: World) -> tuple[subprocess.Popen[bytes], int]:
    shell = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    world.pool.processes.append(shell)

    def child() -> int | None:
        try:
            with open(f"/proc/{shell.pid}/task/{shell.pid}/children") as file:
                found = file.read().split()
        except OSError:
            return None
        return int(found[0]) if found else None

    pid: int = wait_until(child, message="the shell's child")
    return shell, pid


def test_a_step_while_the_reader_runs_changes_nothing_it_answers(
    world: World, clock_step: Callable[[int], None]
) -> None:
    """Receipts and a row with their identity, and a descendant: the same answer, the
    same generation, after steps either way; a receipt without its identity is judged
    by its tolerance against the stepped clock, as before."""
    client, tool = world.pool.start(), world.pool.start()
    shell, child = shell_with_child(world)
    claim(
        world,
        "ses_a",
        {
            "client": (client.pid, recorded(client.pid)),
            "exec": (tool.pid, recorded(tool.pid, -STEP_S)),
            "row": (shell.pid, recorded(shell.pid)),
        },
    )
    legacy = world.pool.start()
    # As an older kit wrote it: the start time alone.
    world.exec_receipt("exe_legacy", legacy.pid, started_at_s=recorded(legacy.pid).started_at_s)
    first = world.ready()
    assert ("ses_a", "descendant", child) in {(s, k, p) for s, k, p, _ in listed(first)}
    assert ("unowned", "exec", legacy.pid) in {(s, k, p) for s, k, p, _ in listed(first)}
    for seconds in (STEP_S, -STEP_S):
        clock_step(seconds)
        stepped = world.ready()
        assert stepped.sessions == first.sessions
        assert [p.pid for p in stepped.unowned] == []  # the old receipt misses by the step
