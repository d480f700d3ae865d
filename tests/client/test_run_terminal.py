"""The terminal is CMD's under `capsulectl run`: a real pseudo-terminal, a real interactive
bash with job control, the real launcher (docs/design.md §10).

CMD is ``tests/run_probe.py``, which says what it sees and which signals reach it.
No daemon runs: the launcher warns once and runs CMD all the same.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from helpers.processes import proc_state
from helpers.run import CAPSULECTL
from helpers.waits import wait_until

PROBE = Path(__file__).with_name("run_probe.py")
PROMPT = "PROMPT>"
TIMEOUT_S = 10
READY = re.compile(r"ready (\d+) (\d+) tty=(\S+) fg=(\S+) size (\d+) (\d+)")


class Shell:
    """An interactive bash on a pseudo-terminal, with its own prompt."""

    def __init__(self, tmp: Path) -> None:
        env = dict(os.environ)
        env.update(
            PS1=PROMPT,
            CAPSULE_HOME=str(tmp / "home"),
            CAPSULED_SOCKET=str(tmp / "none.sock"),
            TERM="dumb",
        )
        self.child = pexpect.spawn(
            "bash",
            ["--norc", "--noprofile", "-i"],
            env=env,
            encoding="utf-8",
            dimensions=(24, 80),
            timeout=TIMEOUT_S,
        )
        self.child.expect_exact(PROMPT)

    def run(self, argv: list[str]) -> None:
        """Type ``capsulectl run -- ARGV`` at the prompt."""
        self.child.sendline(shlex.join([*CAPSULECTL, "run", "--", *argv]))

    def probe(self, *args: str) -> tuple[int, int, str, str, int, int]:
        """Start the probe under the launcher: (pid, its parent, tty, fg, rows, columns)."""
        self.run([sys.executable, str(PROBE), *args])
        self.child.expect(READY)
        m = self.child.match
        return int(m[1]), int(m[2]), m[3], m[4], int(m[5]), int(m[6])

    def status(self) -> int:
        """The exit status of the last command, once the prompt is back."""
        self.child.expect_exact(PROMPT)
        self.child.sendline("echo status=$?")
        self.child.expect(r"status=(\d+)")
        status = int(self.child.match[1])
        self.child.expect_exact(PROMPT)
        return status

    def close(self) -> None:
        self.child.close(force=True)


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    bash = Shell(tmp_path)
    try:
        yield bash
    finally:
        bash.close()


def test_cmd_sees_a_terminal_in_the_foreground_and_its_status_comes_back(shell: Shell) -> None:
    pid, launcher, tty, fg, rows, columns = shell.probe()
    assert (tty, fg, rows, columns) == ("True,True", "True", 24, 80)
    assert os.getpgid(pid) == pid != os.getpgid(launcher)  # its own group, in the foreground
    shell.child.sendline("exit 7")
    assert shell.status() == 7


def test_a_launcher_whose_stdin_is_not_the_terminal_leaves_it_alone(shell: Shell) -> None:
    # As a runtime starting a tool command with spawn(..., stdin=DEVNULL) would.
    shell.child.sendline(
        shlex.join([*CAPSULECTL, "run", "--", sys.executable, str(PROBE)]) + " < /dev/null"
    )
    shell.child.expect(READY)
    assert (shell.child.match[3], shell.child.match[4]) == ("False,True", "False")
    assert shell.status() == 0


def test_ctrl_c_reaches_cmd_once_and_not_the_launcher(shell: Shell) -> None:
    shell.probe()
    shell.child.sendintr()
    shell.child.expect_exact("got INT")
    shell.child.sendline("size")  # the probe still runs, and so does the launcher
    shell.child.expect(r"size 24 80")
    assert "got INT" not in shell.child.before
    shell.child.sendline("exit 0")
    assert shell.status() == 0


def test_ctrl_c_that_kills_cmd_is_128_plus_sigint(shell: Shell) -> None:
    shell.probe("--default-int")
    shell.child.sendintr()
    assert shell.status() == 128 + signal.SIGINT


def test_ctrl_z_stops_both_and_fg_continues_both(shell: Shell) -> None:
    pid, launcher, *_ = shell.probe()
    shell.child.sendcontrol("z")
    shell.child.expect(r"Stopped")
    shell.child.expect_exact(PROMPT)
    assert proc_state(pid) == "T"
    wait_until(lambda: proc_state(launcher) == "T", message="the launcher stopped")
    shell.child.sendline("fg")
    shell.child.expect_exact("got CONT")
    assert proc_state(launcher) != "T"
    shell.child.sendline("size")  # reads the terminal again: it is the foreground group
    shell.child.expect(r"size 24 80")
    shell.child.sendline("exit 3")
    assert shell.status() == 3


def test_window_size_matches_and_follows_a_resize(shell: Shell) -> None:
    shell.run(["stty", "size"])
    shell.child.expect(r"24 80")
    assert shell.status() == 0
    shell.probe()
    shell.child.setwinsize(30, 100)
    shell.child.expect(r"size 30 100")
    shell.child.sendline("exit 0")
    assert shell.status() == 0


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name
)
def test_a_signal_sent_to_the_launcher_is_forwarded(shell: Shell, signum: signal.Signals) -> None:
    _, launcher, *_ = shell.probe()
    os.kill(launcher, signum)
    shell.child.expect_exact(f"got {signum.name[3:]}")
    shell.child.sendline("size")
    shell.child.expect(r"size 24 80")
    assert f"got {signum.name[3:]}" not in shell.child.before  # once
    shell.child.sendline("exit 0")
    assert shell.status() == 0


def test_cmd_killed_by_a_signal_is_128_plus_n(shell: Shell) -> None:
    shell.probe()
    shell.child.sendline(f"kill {int(signal.SIGKILL)}")
    assert shell.status() == 128 + signal.SIGKILL
