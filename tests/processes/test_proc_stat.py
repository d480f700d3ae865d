"""The one ``/proc/<pid>/stat`` parser, on real processes: a child, an odd name, a zombie."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers.processes import Sleepers, proc_state
from helpers.waits import wait_until

from capsule_client.kit.proc import (
    ProcStat,
    boot_time_s,
    parse_stat,
    read_stat,
    start_time_s,
    ticks_per_s,
)
from capsule_client.kit.receipts import process_start_time
from capsuled.processes.exits import _start_time
from capsuled.processes.sample import sample_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

NO_SUCH_PID = 2**31 - 1


@pytest.fixture
def odd_sleep(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``sleep`` run from a copy named so that its command name holds spaces and ``)``."""
    binary = tmp_path / "a) b (c) d"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    process = subprocess.Popen([str(binary), "300"])
    try:
        wait_until(lambda: proc_state(process.pid) == "S", message=f"{binary.name} sleeping")
        yield process
    finally:
        process.kill()
        process.wait(timeout=5)


def test_a_child_names_this_process_as_parent_and_shares_its_session(pool: Sleepers) -> None:
    child = pool.start()

    stat = read_stat(child.pid)

    assert stat.state == "S"
    assert stat.ppid == os.getpid()
    assert stat.session_id == os.getsid(0)
    assert read_stat(os.getpid()).ppid == os.getppid()


def test_a_child_in_a_new_session_leads_it() -> None:
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        wait_until(lambda: proc_state(child.pid) == "S", message="sleep running")
        stat = read_stat(child.pid)
    finally:
        child.kill()
        child.wait(timeout=5)

    assert stat.session_id == child.pid != os.getsid(0)
    assert stat.ppid == os.getpid()


def test_a_command_name_with_spaces_and_parentheses_parses(
    odd_sleep: subprocess.Popen[bytes],
) -> None:
    raw = Path(f"/proc/{odd_sleep.pid}/stat").read_bytes()
    assert b"(a) b (c) d)" in raw, raw

    stat = read_stat(odd_sleep.pid)

    assert (stat.state, stat.ppid, stat.session_id) == ("S", os.getpid(), os.getsid(0))
    started = start_time_s(stat.start_ticks, boot_time_s(), ticks_per_s())
    assert started == pytest.approx(psutil.Process(odd_sleep.pid).create_time(), abs=0.01)
    assert process_start_time(odd_sleep.pid) == started


def test_a_zombie_is_read_as_one_and_is_not_live(pool: Sleepers) -> None:
    child = pool.start()
    live_start = _start_time(child.pid)
    pool.kill(child, reap=False)

    stat = read_stat(child.pid)

    assert stat.state == "Z"
    assert stat.ppid == os.getpid()
    assert live_start is not None, "a sleeping process has a start time"
    assert _start_time(child.pid) is None, "the exit watch's re-check: a zombie is gone"
    assert child.pid not in sample_processes(), "the process sample leaves zombies out"


def test_the_sample_the_exit_watch_and_the_receipt_writer_agree_on_a_start_time(
    pool: Sleepers,
) -> None:
    child = pool.start()

    sampled = sample_processes()[child.pid]

    assert _start_time(child.pid) == sampled  # one boot time read apart: the same ticks
    assert process_start_time(child.pid) == pytest.approx(sampled.s, abs=1.0)


def test_the_fields_are_counted_from_the_last_parenthesis() -> None:
    tail = b" ".join(str(n).encode() for n in range(7, 53))
    line = b"4242 (x) (y) S 17 4242 99 " + tail + b"\n"

    assert parse_stat(line) == ProcStat(state="S", ppid=17, session_id=99, start_ticks=22)


@pytest.mark.parametrize(
    "line",
    [b"", b"4242 (no closing parenthesis S 1 2 3", b"4242 (x) S 1 2 3\n", b"4242 (x) S a b c " * 4],
)
def test_what_is_not_a_stat_line_raises_value_error(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_stat(line)


def test_a_missing_pid_raises_process_lookup_error() -> None:
    with pytest.raises(ProcessLookupError):
        read_stat(NO_SUCH_PID)
