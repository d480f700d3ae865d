"""The report `capsulectl run` prints at CMD's exit (docs/design.md §10)."""

from __future__ import annotations

import subprocess

from helpers.run import with_argv
from helpers.waits import wait_until

from capsule_client.cli.run import process_command_line, render_leftovers
from capsule_client.wire import SessionProcess


def test_one_line_per_process_with_pid_age_and_command() -> None:
    processes = [
        SessionProcess("descendant", 4242, 1000, command=["npm", "run", "dev server"]),
        SessionProcess("descendant", 17, 1000 - 7200, command=["tsc", "--watch\x1b[2J"]),
    ]
    text = render_leftovers("ses_a", processes, now_s=1090.0)
    assert text.splitlines() == [
        "capsulectl run: session ses_a still has 2 processes:",
        "    17  2h01m  tsc '--watch\\x1b[2J'",
        "  4242  1m30s  npm run 'dev server'",
    ]


def test_without_the_daemons_argv_the_command_is_read_here_or_the_receipts() -> None:
    with subprocess.Popen(["sleep", "30"]) as sleep:
        try:
            # Popen returns at exec's point of no return, before the new argv is in place.
            wait_until(lambda: with_argv(sleep.pid) == ["sleep", "30"], message="the exec")
            live = SessionProcess("descendant", sleep.pid, 0, command=None)
            assert process_command_line(live) == "sleep 30"
        finally:
            sleep.kill()
    gone = SessionProcess("exec", 2**22 + 1, 0, receipt_command="make test")
    assert process_command_line(gone) == "make test"
    assert process_command_line(SessionProcess("descendant", 2**22 + 1, 0)) == "?"
