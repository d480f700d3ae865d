"""Each command's ``--help`` gives the ``--timeout`` it uses (docs/design.md §9, §10):
``run`` waits 10 s for its ping and its look at CMD's exit, the others 5 s."""

from __future__ import annotations

import subprocess
import sys

import pytest

from capsule_client.cli.parser import COMMANDS
from capsule_client.wire.constants import DEFAULT_TIMEOUT_S


def help_of(command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "capsule_client.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


@pytest.mark.parametrize(("command", "seconds"), [("run", 10), ("sessions", 5), ("mcp", 5)])
def test_the_help_gives_the_timeout_the_command_uses(command: str, seconds: int) -> None:
    assert COMMANDS[command].timeout_s == seconds
    assert f"seconds to wait for a reply, at most 86400 (default: {seconds})" in help_of(command)


def test_every_command_but_run_uses_the_clients_default() -> None:
    assert {name for name, c in COMMANDS.items() if c.timeout_s != DEFAULT_TIMEOUT_S} == {"run"}
