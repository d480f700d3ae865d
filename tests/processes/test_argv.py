"""The argv of real processes, read once per (pid, start) (docs/design.md §5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from helpers.processes import Processes, proc_state
from helpers.waits import wait_until

from capsule_client.kit.proc import read_stat, start_time_s
from capsuled.processes.argv import (
    ELLIPSIS,
    MAX_ARGV_BYTES,
    ArgvCache,
    argv_of,
    cut_argv,
    decode_cmdline,
)
from capsuled.processes.table import Clock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: A Python child that waits, with the rest of its argv as given.
WAITS = "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(300)"


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    try:
        yield started
    finally:
        started.close()


def started_at(pid: int) -> int:
    """The (pid, start) key an answer lists the process under: its start, whole seconds."""
    clock = Clock()
    return round(start_time_s(read_stat(pid).start_ticks, clock.boot_time_s, clock.ticks_per_s))


def waiting(processes: Processes, *args: str | bytes) -> subprocess.Popen[bytes]:
    process = processes.start([sys.executable, "-c", WAITS, *args], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    return process


def test_spaces_quotes_and_bytes_that_are_not_utf8(processes: Processes) -> None:
    odd = b"caf\xc3\xa9 \xff\xfe end"
    process = waiting(processes, "two words", "say \"hi\" 'there'", odd, "")
    argv = argv_of(process.pid, started_at(process.pid))
    assert argv == [
        sys.executable,
        "-c",
        WAITS,
        "two words",
        "say \"hi\" 'there'",
        "café \\xff\\xfe end",  # ps-like escapes: no byte lost, and valid UTF-8 for JSON
        "",
    ]
    json.dumps(argv, ensure_ascii=False).encode()  # encodes: no lone surrogate


def test_a_long_argv_is_cut_within_4_kib_with_a_final_ellipsis(processes: Processes) -> None:
    process = waiting(processes, "x" * 3000, "é" * 3000, "never shown")
    argv = argv_of(process.pid, started_at(process.pid))
    assert argv is not None
    assert argv[:4] == [sys.executable, "-c", WAITS, "x" * 3000]
    assert len(argv) == 5 and argv[4].endswith(ELLIPSIS) and set(argv[4][:-1]) == {"é"}
    assert sum(len(arg.encode()) for arg in argv) + len(argv) - 1 <= MAX_ARGV_BYTES
    # Cut at a character, not inside the two bytes of an é.
    assert MAX_ARGV_BYTES - 2 <= sum(len(a.encode()) for a in argv) + len(argv) - 1


def test_cut_rules() -> None:
    assert cut_argv(["a", "b"]) == ["a", "b"]
    exact = ["a" * 2000, "b" * 2095]  # 2000 + 1 + 2095 = 4096
    assert cut_argv(exact) == exact
    cut = cut_argv(["a" * 2000, "b" * 2096, "c"])
    assert cut == ["a" * 2000, "b" * 2092 + ELLIPSIS]
    assert cut_argv(["a" * 4092, "bcdef"]) == ["a" * 4092, ELLIPSIS]  # no room: the mark alone
    assert cut_argv(["a" * 4093, "bcd"]) == ["a" * 4093 + ELLIPSIS]
    for args in (["a" * 4092, "bcdef"], ["a" * 4093, "bcd"], ["é" * 2047, "b"], ["x" * 9999]):
        cut = cut_argv(args)
        assert sum(len(a.encode()) for a in cut) + len(cut) - 1 <= MAX_ARGV_BYTES, args
    assert decode_cmdline(b"") is None
    assert decode_cmdline(b"\0") == [""]
    assert decode_cmdline(b"postgres: writer") == ["postgres: writer"]  # setproctitle, no NULs


def test_an_exec_shows_the_new_program_at_the_next_check(processes: Processes) -> None:
    shell = processes.start(["sh", "-c", "read go; exec sleep 301"], stdin=subprocess.PIPE)
    wait_until(lambda: proc_state(shell.pid) == "S", message="the shell waiting")
    key = (shell.pid, started_at(shell.pid))
    cache = ArgvCache()
    assert cache.read([key]) == {key: ["sh", "-c", "read go; exec sleep 301"]}
    reads = cache.reads
    assert cache.read([key]) == {key: ["sh", "-c", "read go; exec sleep 301"]}
    assert cache.cached([key]) == {key: ["sh", "-c", "read go; exec sleep 301"]}
    assert cache.reads == reads  # kept: read once per (pid, start)

    assert shell.stdin is not None
    shell.stdin.write(b"go\n")
    shell.stdin.flush()
    wait_until(
        lambda: cache.read([key], fresh=True) == {key: ["sleep", "301"]},
        message="the exec'd program's argv",
    )
    assert cache.reads > reads
    # The same pid and start: the same process, now another program.
    assert key == (shell.pid, started_at(shell.pid))
    reads = cache.reads
    assert cache.read([key], fresh=True) == {key: ["sleep", "301"]}
    assert cache.reads == reads  # checked (its stat line), not read again
    shell.stdin.close()


#: A Python child that sleeps and wakes thousands of times a second: its state letter
#: in ``/proc/<pid>/stat`` changes between almost any two reads.
FLICKERS = (
    "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    "while True: time.sleep(0.0001)"
)


def test_a_process_that_sleeps_and_wakes_all_the_time_has_its_command_every_time(
    processes: Processes,
) -> None:
    """Running and sleeping between the stat reads around the argv read is no exec: the
    command is read every time, and a kept one is not read again."""
    process = processes.start([sys.executable, "-c", FLICKERS], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    key = (process.pid, started_at(process.pid))
    expected = [sys.executable, "-c", FLICKERS]
    assert [argv_of(*key) for _ in range(300)] == [expected] * 300
    cache = ArgvCache()
    assert cache.read([key]) == {key: expected}
    reads = cache.reads
    assert all(cache.read([key], fresh=True) == {key: expected} for _ in range(300))
    assert cache.reads == reads  # checked 300 times, never read again


def test_a_zombie_has_no_command(processes: Processes) -> None:
    process = processes.start(["sleep", "300"])
    wait_until(lambda: proc_state(process.pid) == "S", message="sleep running")
    key = (process.pid, started_at(process.pid))
    cache = ArgvCache()
    assert cache.read([key]) == {key: ["sleep", "300"]}
    os.kill(process.pid, 9)
    wait_until(lambda: proc_state(process.pid) == "Z", message="a zombie")
    assert cache.read([key], fresh=True) == {key: None}
    assert argv_of(*key) is None


def test_a_reused_or_gone_pid_has_no_command(processes: Processes) -> None:
    process = processes.start(["sleep", "300"])
    wait_until(lambda: proc_state(process.pid) == "S", message="sleep running")
    start = started_at(process.pid)
    assert argv_of(process.pid, start - 3600) is None  # listed as another, older process
    process.kill()
    process.wait()
    assert argv_of(process.pid, start) is None


def test_prune_forgets_what_is_no_longer_listed(processes: Processes) -> None:
    first, second = processes.sleep(), processes.sleep()
    keys = [(p.pid, started_at(p.pid)) for p in (first, second)]
    cache = ArgvCache()
    cache.read(keys, prune=True)
    cache.read(keys[:1], prune=True)
    assert cache.cached(keys[:1]) is not None
    assert cache.cached(keys) is None  # the second is no longer kept


@pytest.mark.skipif(os.geteuid() != 0, reason="making a process of another uid needs root")
def test_a_process_of_another_uid(processes: Processes) -> None:
    # A child that drops to nobody: the reader is not its uid.
    nobody = processes.start(
        [
            sys.executable,
            "-c",
            "import os, time; os.setuid(65534); print('ready', flush=True); time.sleep(300)",
            "as nobody",
        ],
        stdout=subprocess.PIPE,
    )
    assert nobody.stdout is not None and nobody.stdout.readline() == b"ready\n"
    assert os.stat(f"/proc/{nobody.pid}").st_uid == 65534
    argv = argv_of(nobody.pid, started_at(nobody.pid))
    # Linux shows any uid's argv unless /proc is mounted with hidepid; then the OS does not say.
    with open("/proc/mounts") as mounts:
        hidden = "hidepid" in mounts.read()
    assert argv == (None if hidden else [sys.executable, "-c", nobody.args[2], "as nobody"])

    # And the other way round: a reader of another uid than the process's. Its
    # argv address is hidden from it (no ptrace right), so only the command name
    # tells an exec; the argv itself is shown.
    sleeper = processes.sleep()
    reader = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from capsuled.processes.argv import argv_of; os.setuid(65534); "
            "print(argv_of(int(sys.argv[1]), int(sys.argv[2])))",
            str(sleeper.pid),
            str(started_at(sleeper.pid)),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert reader.returncode == 0, reader.stderr
    assert reader.stdout.strip() == ("None" if hidden else "['sleep', '300']")
